"""What query_sql may run: an allow-list over DuckDB's own parse of the query, not a deny-list over its text.

A query is bounded before any parsing (length, bracket and comment nesting: one linear scan), then parsed by DuckDB
(json_serialize_sql on a private in-memory connection, which serializes SELECT statements only) and its tree walked:
every node must be a kind listed here, every table one of the model's tables or views (or the query's own CTEs),
every function one of FUNCTIONS, and the functions that make values larger than their inputs take constant, bounded
arguments. Anything else is refused in one sentence naming what was refused and what to do instead.
"""

from __future__ import annotations

import difflib
import json
import re
import threading
from collections.abc import Iterator
from typing import Any

import duckdb

from stallhound.model.errors import QueryRefused

# characters: a question about a profile fits in a few hundred; DuckDB's parser slows down faster than linearly on
# long deeply nested text (30,000 nested comments took 29 s), and at this length and MAX_NESTING it takes < 50 ms.
MAX_SQL_CHARS = 20_000
MAX_NESTING = 64  # brackets and /* comments open at once: real queries nest a handful; depth is what parsing pays for
MAX_SERIES_ROWS = 1_000_000  # rows range()/generate_series() may make: enough for any bucket grid over a profile
MAX_MADE_CHARS = 100_000  # characters (or list items) one call of repeat/lpad/rpad/list_resize/... may make per value
MAX_REPEAT_OF_COLUMN = 100  # times repeat() may copy a value that is not a constant (its length is the data's)
MAX_FORMAT_WIDTH_DIGITS = 5  # digits of a width in printf()/format() patterns: widths up to 99,999 characters

# The parse tree's node kinds a plain query is made of; anything else (PIVOT, recursive CTEs, parameters, time travel,
# table functions other than these) is refused.
EXPRESSIONS = {"BETWEEN", "CASE", "CAST", "COLLATE", "COLUMN_REF", "COMPARISON", "CONJUNCTION", "CONSTANT",
               "FUNCTION", "LAMBDA", "LAMBDA_REF", "OPERATOR", "POSITIONAL_REFERENCE", "STAR", "SUBQUERY", "WINDOW"}
NODES = {"SELECT_NODE", "SET_OPERATION_NODE", "CTE_NODE"}
TABLES = {"BASE_TABLE", "JOIN", "SUBQUERY", "TABLE_FUNCTION", "EXPRESSION_LIST", "EMPTY", "SHOW_REF"}
OTHER = {"ORDER_MODIFIER", "LIMIT_MODIFIER", "LIMIT_PERCENT_MODIFIER", "DISTINCT_MODIFIER",
         "ASCENDING", "DESCENDING", "ORDER_DEFAULT", "INVALID", "NULLS_FIRST", "NULLS_LAST", "ORDER_DEFAULT_NULLS"}
TABLE_FUNCTIONS = {"range", "generate_series", "unnest"}
SERIES = {"range", "generate_series"}
SIZED = {"repeat": 1, "lpad": 1, "rpad": 1, "list_resize": 1, "array_resize": 1, "to_base": 2}  # name -> size arg
PATTERNED = {"printf", "format"}

# Scalar, aggregate and window functions that compute on their arguments only: no settings, files, logs, sequences,
# variables, sleeps, connection or host facts, nor functions that parse or plan other SQL. Operators are functions too.
FUNCTIONS = frozenset("""
!__postfix !~~ !~~* % & && * ** + - ->> / // <-> << <=> <@ >> @ @> ^ ^@ | || ~ ~~ ~~* ~~~
abs acos acosh add age any_value apply approx_count_distinct approx_quantile approx_top_k arbitrary arg_max
arg_max_null arg_max_nulls_last arg_min arg_min_null arg_min_nulls_last argmax argmin array_agg array_append
array_apply array_cat array_concat array_contains array_cosine_distance array_cosine_similarity array_cross_product
array_distance array_distinct array_dot_product array_extract array_filter array_grade_up array_has array_has_all
array_has_any array_indexof array_inner_product array_intersect array_length array_pop_back array_pop_front
array_position array_prepend array_reduce array_resize array_reverse array_reverse_sort array_select array_slice
array_sort array_to_json array_to_string array_transform array_unique array_value array_where array_zip ascii asin
asinh atan atan2 atanh avg bar base64 bin bit_and bit_count bit_length bit_or bit_position bit_xor bool_and bool_or
cardinality cbrt ceil ceiling century char_length character_length chr concat concat_ws contains corr cos cosh cot
count count_if count_star countif covar_pop covar_samp cume_dist current_date date_add date_diff date_part date_sub
date_trunc datediff datepart datesub datetrunc day dayname dayofmonth dayofweek dayofyear decade decode degrees
dense_rank divide editdist3 element_at encode ends_with entropy epoch epoch_ms epoch_ns epoch_us era error even exp
factorial favg fdiv filter first first_value flatten floor fmod format format_bytes formatReadableDecimalSize
formatReadableSize from_base64 from_hex from_json from_json_strict fsum gamma gcd generate_series geomean
geometric_mean greatest greatest_common_divisor grade_up group_concat hamming hash hex histogram histogram_exact
hour ilike_escape instr isfinite isinf isnan isodow isoyear jaccard jaro_similarity jaro_winkler_similarity
json_array json_array_length json_contains json_exists json_extract json_extract_path json_extract_path_text
json_extract_string json_group_array json_group_object json_keys json_object json_quote json_structure
json_transform json_type json_valid json_value julian kahan_sum kurtosis kurtosis_pop lag last last_day last_value
lcase lcm lead least least_common_multiple left len length levenshtein lgamma like_escape list list_aggr
list_aggregate list_any_value list_append list_apply list_avg list_cat list_concat list_contains list_count
list_distinct list_element list_extract list_filter list_first list_grade_up list_has list_has_all list_has_any
list_indexof list_intersect list_last list_max list_median list_min list_mode list_pack list_position
list_prepend list_product list_reduce list_resize list_reverse list_reverse_sort list_select list_slice list_sort
list_stddev_pop list_stddev_samp list_string_agg list_sum list_transform list_unique list_value list_var_pop
list_var_samp list_where list_zip listagg ln log log10 log2 lower lpad ltrim mad make_date make_time
make_timestamp make_timestamp_ms make_timestamp_ns map map_concat map_contains map_entries map_extract
map_extract_value map_from_entries map_keys map_values max max_by md5 mean median microsecond millennium
millisecond min min_by minute mismatches mod mode month monthname multiply nanosecond nextafter nfc_normalize
normalized_interval not_ilike_escape not_like_escape now nth_value ntile nullif octet_length ord parse_formatted_bytes
percent_rank pi position pow power prefix printf product quantile quantile_cont quantile_disc quarter radians
random range rank rank_dense reduce regexp_escape regexp_extract regexp_extract_all regexp_full_match
regexp_matches regexp_replace regexp_split_to_array regr_avgx regr_avgy regr_count regr_intercept regr_r2
regr_slope regr_sxx regr_sxy regr_syy repeat replace reservoir_quantile reverse right round round_even
roundbankers row row_number rpad rtrim second sem sha1 sha256 sign signbit sin sinh skewness split split_part
sqrt starts_with stddev stddev_pop stddev_samp str_split str_split_regex strftime string_agg string_split
string_split_regex string_to_array strip_accents strlen strpos strptime struct_extract struct_extract_at
struct_insert struct_pack substr substring subtract suffix sum sum_no_overflow sumkahan tan tanh time_bucket
timezone timezone_hour timezone_minute to_base to_base64 to_binary to_centuries to_days to_decades to_hex to_hours
to_json to_microseconds to_millennia to_milliseconds to_minutes to_months to_quarters to_seconds to_timestamp
to_weeks to_years today translate trim trunc try_strptime typeof ucase unbin unhex unicode unnest upper
url_decode url_encode uuid var_pop var_samp variance wavg week weekday weekofyear weighted_avg xor year yearweek
""".split())

DUCKDB_POINTER = re.compile(r"\n\s*LINE \d+:.*", re.S)  # DuckDB's echo of the statement and a caret under it
DUCKDB_ADVICE = re.compile(r"\s*(Use|See|Consider)\b[^.]*(SET|PRAGMA|https?:)[^.]*\.?", re.S)  # settings we refuse
_parser_lock = threading.Lock()
_parser: duckdb.DuckDBPyConnection | None = None
FIX = "describe_schema lists what a query may read"


def sql_error(message: object) -> str:
    """DuckDB's message on one line, without its statement echo or advice to change settings (which query_sql
    refuses): keeps hints such as 'Did you mean "kernels"?'."""
    text = DUCKDB_ADVICE.sub("", DUCKDB_POINTER.sub("", str(message)))
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def bound_text(sql: str) -> None:
    """Refuse a query too long or too deeply nested to parse quickly: a linear scan, before DuckDB sees it. Brackets
    and comments are counted inside strings too (never fewer than the parser sees), and a closer never goes below 0."""
    if len(sql) > MAX_SQL_CHARS:
        raise QueryRefused(f"the query is {len(sql):,} characters, over query_sql's {MAX_SQL_CHARS:,}; ask a "
                           "shorter question (aggregate in SQL instead of listing values)")
    brackets = comments = deepest = 0
    previous = ""
    for char in sql:
        pair = previous + char
        if char == "(":
            brackets += 1
        elif char == ")":
            brackets = max(0, brackets - 1)
        elif pair == "/*":
            comments += 1
        elif pair == "*/":
            comments = max(0, comments - 1)
        deepest = max(deepest, brackets + comments)
        previous = "" if pair in ("/*", "*/") else char
    if deepest > MAX_NESTING:
        raise QueryRefused(f"the query nests brackets or comments {deepest} deep, over query_sql's {MAX_NESTING}; "
                           "flatten it (a WITH clause per step)")


def _serialize(sql: str) -> dict[str, Any]:
    global _parser
    with _parser_lock:
        if _parser is None:
            _parser = duckdb.connect(":memory:", config={"enable_external_access": False, "threads": 1,
                                                         "autoload_known_extensions": False,
                                                         "autoinstall_known_extensions": False})
            _parser.execute("SET lock_configuration = true")
        row = _parser.execute("SELECT json_serialize_sql($sql)", {"sql": sql}).fetchone()
    assert row is not None, "json_serialize_sql returns one row"
    return dict(json.loads(row[0]))


def parse(sql: str) -> dict[str, Any]:
    """The parse tree of the one SELECT statement `sql` holds, or QueryRefused in one sentence."""
    bound_text(sql)
    tree = _serialize(sql)
    if tree.get("error"):
        if "Only SELECT" not in str(tree.get("error_message")):
            raise QueryRefused(f"the SQL does not parse ({sql_error(tree.get('error_message'))[:200]}); "
                               "fix the syntax")
        raise QueryRefused(f"only SELECT or WITH queries (or DESCRIBE of one) are allowed, not {_kinds(sql)}; "
                           "the model is read-only, and settings, files, logging and extensions are off limits")
    statements = tree["statements"]
    if len(statements) != 1:
        raise QueryRefused(f"send exactly one statement (got {len(statements)}); split them into separate calls")
    return dict(statements[0]["node"])


def _kinds(sql: str) -> str:
    """The kinds of statement `sql` holds, e.g. "COPY", as DuckDB names them, else its first word."""
    try:
        return ", ".join(sorted({s.type.name for s in duckdb.extract_statements(sql)}))
    except duckdb.Error:  # extract_statements looks PRAGMA names up, and refuses unknown ones
        return sql.split(None, 1)[0].upper()[:20]


def check(sql: str, tables: set[str]) -> None:
    """Refuse `sql` unless it is one plain query over `tables` (the model's tables and views) using FUNCTIONS only."""
    node = parse(sql)
    known = tables | {entry["key"].lower() for entry in _nodes_with(node, "cte_map") for entry in entry["map"]}
    for item in _walk(node):
        _check_item(item, known)


def _nodes_with(tree: Any, key: str) -> Iterator[Any]:
    return (item[key] for item in _walk(tree) if key in item)


def _walk(tree: Any) -> Iterator[dict[str, Any]]:
    """Every object in the parse tree, without recursion (a long chain of operators is a deep tree)."""
    stack = [tree]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            yield item
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _check_item(item: dict[str, Any], tables: set[str]) -> None:
    kind = item.get("class") or item.get("type")
    if not isinstance(kind, str) or kind.endswith("_TYPE_INFO"):
        return
    if "class" in item:
        if kind not in EXPRESSIONS:
            raise QueryRefused(f"query_sql does not run {kind.lower().replace('_', ' ')} expressions (only plain "
                               "values, columns, operators and the vetted functions); write the value into the SQL")
        if kind in ("FUNCTION", "WINDOW"):
            _check_function(item)
    elif kind == "BASE_TABLE":
        _check_table(item, tables)
    elif kind == "TABLE_FUNCTION":
        name = item["function"].get("function_name", "")
        if name.lower() not in TABLE_FUNCTIONS:
            raise QueryRefused(f"query_sql does not run the table function {name}() (only range, generate_series "
                               f"and unnest); {FIX}")
    elif kind == "SHOW_REF" and item.get("show_type") != "DESCRIBE":
        raise QueryRefused(f"query_sql does not run {item.get('show_type')} (only DESCRIBE of a query); use "
                           "aggregates such as min, max, avg and count")
    elif kind not in NODES | TABLES | OTHER:
        raise QueryRefused(f"query_sql does not run {kind.lower().replace('_', ' ')} (only plain SELECT and WITH "
                           f"queries); {FIX}")


def _check_table(item: dict[str, Any], tables: set[str]) -> None:
    name = str(item.get("table_name", ""))
    qualified = item.get("catalog_name") or item.get("schema_name") not in ("", "main")
    if qualified or name.lower() not in tables or item.get("at_clause"):
        shown = ".".join(p for p in (item.get("catalog_name"), item.get("schema_name"), name) if p)[:100]
        close = difflib.get_close_matches(name.lower(), sorted(tables), 1)
        hint = f' (Did you mean "{close[0]}"?)' if close else ""
        raise QueryRefused(f"query_sql reads only the model's tables and views, and {shown!r} is not one of "
                           f"them{hint}; {FIX}")


def _check_function(item: dict[str, Any]) -> None:
    name = str(item.get("function_name", ""))
    if item.get("catalog") or item.get("schema") not in ("", "main") or name.lower() not in FUNCTIONS:
        raise QueryRefused(f"query_sql does not run the function {name[:100]}() (it computes on values only: "
                           "arithmetic, text, time, list, JSON and aggregate functions); compute it another way")
    args = item.get("children", [])
    if name.lower() in SERIES:
        _check_series(name, args)
    elif name.lower() in SIZED:
        _check_sized(name, args, SIZED[name.lower()])
    elif name.lower() in PATTERNED and args:
        _check_pattern(name, args[0])


def _constant(arg: dict[str, Any]) -> Any:
    """The value of a constant argument, or None (for a column, an expression or NULL)."""
    if arg.get("class") == "CONSTANT" and not arg["value"].get("is_null"):
        return arg["value"].get("value")
    return None


def _check_series(name: str, args: list[dict[str, Any]]) -> None:
    values = [_constant(a) for a in args]
    if not 1 <= len(values) <= 3 or not all(type(v) is int for v in values):
        raise QueryRefused(f"{name}() takes 1 to 3 whole-number constants in query_sql; write the numbers in")
    start, stop, step = (0, values[0], 1) if len(values) == 1 else (*values[:2], values[2] if len(values) > 2 else 1)
    if step == 0:
        raise QueryRefused(f"{name}() with a step of 0 never ends; give a step other than 0")
    rows = max(0, -(-(stop - start) // step) if name.lower() == "range" else (stop - start) // step + 1)
    if rows > MAX_SERIES_ROWS:
        raise QueryRefused(f"{name}({', '.join(map(str, values))}) makes {rows:,} rows, over query_sql's "
                           f"{MAX_SERIES_ROWS:,}; use a coarser step")


def _check_sized(name: str, args: list[dict[str, Any]], at: int) -> None:
    size = _constant(args[at]) if len(args) > at else 0
    made = size * len(text) if name.lower() == "repeat" and isinstance(text := _constant(args[0]), str) else size
    limit = MAX_REPEAT_OF_COLUMN if name.lower() == "repeat" and not isinstance(_constant(args[0]), str) \
        else MAX_MADE_CHARS
    if type(size) is not int or made > limit:
        raise QueryRefused(f"{name}() may make values of at most {limit:,} characters or items in query_sql, with "
                           "a whole-number constant for the size; ask for a smaller size")


def _check_pattern(name: str, pattern: dict[str, Any]) -> None:
    text = _constant(pattern)
    digits = max((len(run) for run in "".join(c if c.isdigit() else " " for c in str(text)).split()), default=0)
    if not isinstance(text, str) or digits >= MAX_FORMAT_WIDTH_DIGITS + 1:
        raise QueryRefused(f"{name}() needs a constant pattern with widths under {10 ** MAX_FORMAT_WIDTH_DIGITS:,} "
                           "in query_sql; write the pattern in")
