#!/usr/bin/env bash
# The step action.yml runs: `stallhound diff BASELINE CANDIDATE --format markdown --fail-on-regression PCT`, its
# markdown written to the log and appended to the job summary ($GITHUB_STEP_SUMMARY). Exits as the diff does: 1 when
# the candidate regressed by more than PCT (the step fails), 2 when the profiles could not be compared (the reason
# goes to the summary too), 0 otherwise. STALLHOUND names the command (default: stallhound on PATH).
set -uo pipefail

: "${BASELINE:?set BASELINE to the profile captured before the change}"
: "${CANDIDATE:?set CANDIDATE to the profile captured after the change}"
pct=${FAIL_ON_REGRESSION:-5}
summary=${GITHUB_STEP_SUMMARY:-/dev/null}
out=$(mktemp)
err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT

"${STALLHOUND:-stallhound}" diff "$BASELINE" "$CANDIDATE" --format markdown --fail-on-regression "$pct" \
  >"$out" 2>"$err"
status=$?
cat "$out"
cat "$err" >&2
{
  cat "$out"
  case $status in
    0) ;;
    1) printf '\n**Regressed by more than %s%%: this check fails.**\n' "$pct" ;;
    *) printf '\n**stallhound could not compare %s with %s:** %s\n' "$BASELINE" "$CANDIDATE" "$(cat "$err")" ;;
  esac
} >>"$summary"
exit "$status"
