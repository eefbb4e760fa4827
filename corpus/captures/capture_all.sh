#!/usr/bin/env bash
# Makes every capture of this folder on a machine with an NVIDIA GPU, PyTorch and (for the nsys ones) Nsight
# Systems: corpus/captures/capture_all.sh OUTDIR. Each program runs alone on the GPU, under a time limit; one
# that fails is logged and the rest go on. Traces land in OUTDIR gzipped, with each run's log and the versions.
set -u
out=$(realpath -m "${1:?usage: capture_all.sh OUTDIR}")
mkdir -p "$out"
cd "$(dirname "$0")"
export PYTHONUNBUFFERED=1 PYTHONHASHSEED=0

versions() {
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
    nvcc --version | tail -2
}

wanted() {  # ONLY="a b" makes just those captures
    [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]]
}

kineto() {  # kineto NAME PROGRAM [FLAGS...]: a torch.profiler trace
    local name=$1 program=$2 start=$SECONDS
    wanted "$name" || return 0
    shift 2
    timeout "${LIMIT:-120}" python3 "$program" "$out/$name.json" "$@" >"$out/$name.log" 2>&1
    echo "$name: rc=$? in $((SECONDS - start)) s"
    [ -f "$out/$name.json" ] && gzip -9f "$out/$name.json"
}

find_nsys() {
    command -v nsys && return
    ls /opt/nvidia/nsight-systems*/bin/nsys /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems-cli/*/bin/nsys \
        /opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys 2>/dev/null | head -1
}

import_qdstrm() {  # a bare nsys (as Nsight Compute bundles it) leaves a .qdstrm: its importer makes the report
    local importer
    importer=$(ls "$(dirname "$NSYS")"/../*/QdstrmImporter 2>/dev/null | head -1)
    [ -f "$1.qdstrm" ] && [ -n "$importer" ] &&
        LD_LIBRARY_PATH="$(dirname "$importer"):${LD_LIBRARY_PATH:-}" "$importer" -i "$1.qdstrm"
}

nsys_capture() {  # nsys_capture NAME COMMAND...: an nsys report exported to SQLite
    local name=$1 start=$SECONDS
    shift
    wanted "$name" || return 0
    timeout "${LIMIT:-120}" "$NSYS" profile -t cuda,nvtx,osrt -s none --cuda-memory-usage=true -f true \
        ${NSYS_FLAGS:-} -o "$out/$name" "$@" >"$out/$name.log" 2>&1
    [ -f "$out/$name.nsys-rep" ] || import_qdstrm "$out/$name" >>"$out/$name.log" 2>&1
    timeout 120 "$NSYS" export --type sqlite -f true -o "$out/$name.sqlite" "$out/$name.nsys-rep" \
        >>"$out/$name.log" 2>&1
    echo "$name: rc=$? in $((SECONDS - start)) s"
    rm -f "$out/$name.nsys-rep" "$out/$name.qdstrm"
    [ -f "$out/$name.sqlite" ] && gzip -9f "$out/$name.sqlite"
}

versions | tee "$out/versions.txt"
[ -n "${NSYS_ONLY:-}" ] || {
kineto onestep_resnet onestep_resnet.py
kineto sync_pageable sync_pageable.py
kineto sync_pageable_fixed sync_pageable.py --fixed
kineto dataloader_starved dataloader_starved.py
kineto dataloader_workers dataloader_starved.py --workers
kineto launch_bound launch_bound.py
kineto launch_bound_graph launch_bound.py --graph
kineto alloc_churn alloc_churn.py
kineto gemm_fp32 gemm_dtype.py
kineto gemm_bf16 gemm_dtype.py --bf16
kineto h2d_many_small h2d_many_small.py
kineto annotated_steps annotated_steps.py
kineto host_bound host_bound.py
LIMIT=240 kineto compiled_mlp compiled_mlp.py
}

NSYS=$(find_nsys)
echo "nsys: ${NSYS:-none found}" | tee -a "$out/versions.txt"
if [ -n "$NSYS" ]; then
    "$NSYS" --version | tee -a "$out/versions.txt"
    nvcc -O2 -o "$out/sync_alloc" sync_alloc.cu && LIMIT=60 nsys_capture sync_alloc "$out/sync_alloc"
    nvcc -O2 -o "$out/streams_overlap" streams_overlap.cu &&
        LIMIT=60 nsys_capture streams_overlap "$out/streams_overlap"
    nsys_capture cupy_convergence python3 cupy_convergence.py
    nsys_capture numba_host_arrays python3 numba_host_arrays.py
    XLA_PYTHON_CLIENT_PREALLOCATE=false nsys_capture jax_train python3 jax_train.py
    export CAPTURE_WITH=nsys  # the torch programs run without torch.profiler under nsys
    nsys_capture sync_pageable_nsys python3 sync_pageable.py "$out/discard.json"
    nsys_capture sync_pageable_fixed_nsys python3 sync_pageable.py "$out/discard.json" --fixed
    nsys_capture launch_bound_nsys python3 launch_bound.py "$out/discard.json"
    NSYS_FLAGS="--python-backtrace=cuda" nsys_capture sync_pageable_pybt python3 sync_pageable.py \
        "$out/discard.json"
    rm -f "$out/sync_alloc" "$out/streams_overlap" "$out/discard.json"
fi
ls -l "$out"
