#!/usr/bin/env bash
# gpu_check.sh -- the CUDA backend's checks and benchmark on a machine with an NVIDIA GPU,
# as ONE command.
#
# The GPU machine (this workplace's device tool) reaches no package registry, so what it
# lacks travels with the working tree in .gpu/ (ignored through .git/info/exclude):
#
#   here, once:   bash scripts/gpu_check.sh fetch
#       downloads the PyCUDA sdist and the CPython 3.12 manylinux x86-64 wheels PyCUDA and
#       gradtool need that the GPU image does not have (about 4 MiB).
#   there:        device run, carry [".gpu"], command: bash scripts/gpu_check.sh
#       1. installs the wheels into /tmp/site and builds PyCUDA from the sdist in place
#          (parallel build_ext against the nvcc on PATH);
#       2. runs tests/test_device_cuda.py and tests/test_device_host.py;
#       3. runs `replay-gpu --backend cuda --check` on every sample with the graph, without
#          it (--no-graph), with an Adam step (--train adam) and in float32;
#       4. runs scripts/bench_replay.py (cuda and host next to PyTorch eager and CUDA graphs).
#       Everything is logged under $OUT (or /tmp/gpu_check); the summary table comes last.
#       Exit status: non-zero if the build, a test or a check failed.
set -euo pipefail
cd "$(dirname "$0")/.."

GPU_DIR=.gpu
PYCUDA_VERSION=2026.1
# Not in the GPU image (see .library/device/KINDS.md): PyCUDA's runtime deps, and jsonschema's
# for gradtool's tape-file loader.  --no-deps: every one is named here.
WHEELS="pytools platformdirs mako siphash24 jsonschema jsonschema-specifications referencing rpds-py"

fetch() {
    mkdir -p "$GPU_DIR"
    grep -qxF "/$GPU_DIR/" .git/info/exclude 2>/dev/null || echo "/$GPU_DIR/" >> .git/info/exclude
    python3 -m pip download -q --no-deps --no-binary :all: --no-build-isolation \
        "pycuda==$PYCUDA_VERSION" -d "$GPU_DIR"
    # shellcheck disable=SC2086
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$GPU_DIR" $WHEELS
    ls -l "$GPU_DIR"
    echo "now: device run with carry [\"$GPU_DIR\"] and command 'bash scripts/gpu_check.sh'"
}

run() {
    if [ ! -d "$GPU_DIR" ]; then
        echo "gpu_check: no $GPU_DIR/ here; run 'bash scripts/gpu_check.sh fetch' on a machine" \
             "with PyPI access and carry $GPU_DIR" >&2
        exit 2
    fi
    local out="${OUT:-/tmp/gpu_check}" status=0
    mkdir -p "$out"
    export PYTHONUNBUFFERED=1
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt" || true

    # 1. dependencies and PyCUDA
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site \
        "$GPU_DIR"/*.whl
    export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
    local cuda_root
    cuda_root="$(dirname "$(dirname "$(command -v nvcc)")")"
    rm -rf /tmp/pycuda-src && mkdir -p /tmp/pycuda-src
    tar xzf "$GPU_DIR"/pycuda-*.tar.gz -C /tmp/pycuda-src --strip-components=1
    echo "building PyCUDA $PYCUDA_VERSION against $cuda_root ..."
    if ! (cd /tmp/pycuda-src && python3 configure.py --cuda-root="$cuda_root" --no-cuda-enable-curand \
            && python3 setup.py build_ext --inplace -j "$(nproc)") > "$out/pycuda_build.log" 2>&1; then
        tail -40 "$out/pycuda_build.log"
        echo "gpu_check: the PyCUDA build failed (log: $out/pycuda_build.log)" >&2
        exit 1
    fi
    export PYTHONPATH="/tmp/pycuda-src:$PYTHONPATH"
    python3 -c "from gradtool.device.cuda import cuda_status; ok, why = cuda_status(); print(why); raise SystemExit(0 if ok else 1)"

    # 2. tests (the CUDA file would skip without a device; here it must run)
    python3 -m pytest -q -p no:cacheprovider -rs tests/test_device_cuda.py tests/test_device_host.py \
        2>&1 | tee "$out/pytest.log" || status=1
    if grep -q "SKIPPED.*test_device_cuda" "$out/pytest.log"; then
        echo "gpu_check: the CUDA tests were skipped" >&2
        status=1
    fi

    # 3. replay-gpu --check on every sample, four ways
    : > "$out/replay_check.txt"
    local sample opts
    for sample in samples/*.msgpack samples/lora_block/block.msgpack samples/autoencoder/ae.msgpack; do
        for opts in "" "--no-graph" "--train adam" "--dtype f32"; do
            # shellcheck disable=SC2086
            if ! python3 -c "from gradtool.cli import main; main()" replay-gpu "$sample" \
                    --backend cuda --check --episodes 50 $opts >> "$out/replay_check.txt" 2>&1; then
                echo "gpu_check: replay-gpu --check failed: $sample $opts" | tee -a "$out/replay_check.txt" >&2
                status=1
            fi
        done
    done
    grep -E "^samples|check:|failed" "$out/replay_check.txt" || true

    # 4. the benchmarks (last, so their tables end the output)
    python3 scripts/bench_ae.py --repeats 5 --json "$out/bench_ae.json" \
        2>&1 | tee "$out/bench_ae.txt" || status=1
    python3 scripts/bench_replay.py --repeats 7 --steps 50 --json "$out/bench.json" \
        2>&1 | tee "$out/bench.txt" || status=1
    echo "gpu_check: $([ $status -eq 0 ] && echo passed || echo FAILED); logs in $out"
    exit $status
}

case "${1:-run}" in
    fetch) fetch ;;
    run) run ;;
    *) echo "usage: bash scripts/gpu_check.sh [fetch|run]" >&2; exit 2 ;;
esac
