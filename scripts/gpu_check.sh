#!/usr/bin/env bash
# gpu_check.sh -- the CUDA backend's checks and benchmark on a machine with an NVIDIA GPU,
# as ONE command.
#
# The GPU machine (this workplace's device tool) reaches no package registry, so what it
# lacks travels with the working tree in .gpu/ (ignored through git's info/exclude):
#
#   here, once:   bash scripts/gpu_check.sh fetch
#       downloads the PyCUDA sdist and the manylinux x86-64 wheels that PyCUDA and gradtool
#       need and the GPU image does not have (.library/device/KINDS.md lists what it has):
#       pytools, platformdirs, siphash24 (pytools'), mako; jsonschema and its
#       jsonschema-specifications, referencing, rpds-py.  attrs, typing-extensions,
#       markupsafe, numpy, setuptools, msgpack, click, pytest and torch are in the image.
#       The compiled ones (siphash24, rpds-py) come for CPython 3.11, 3.12 (the image's) and
#       3.13, so a change of the image's python still finds its wheel.  About 6 MiB.
#   there:        device run, carry [".gpu"], timeout_s 600, command: bash scripts/gpu_check.sh
#       0. checks the tools: python3 (and Python.h, which the PyCUDA build needs), nvcc, the
#          CUDA headers, libcuda;
#       1. installs the wheels into /tmp/site and builds PyCUDA from the sdist in place
#          (bundled Boost.Python, g++, numpy's headers; about a minute with the compile
#          spread over the cores);
#       2. runs tests/test_device_cuda.py and tests/test_fusion.py (must not skip),
#          tests/test_device_host.py and tests/test_replay_cli.py (whose auto-backend test
#          then runs on the GPU);
#       3. runs `replay-gpu --backend cuda --check` on every sample with the graph, without
#          it (--no-graph), with an Adam step (--train adam), as its f32 copy (--dtype f32:
#          bit for bit against the copy's CPU reference), and fused (--fuse --train adam,
#          --fuse --dtype f32 --train adam); the f32 samples (*_f32.msgpack) replay as
#          f32 without the flag, every way but --dtype;
#       4. runs two samples under compute-sanitizer memcheck, per-node and fused (when it
#          is installed and a bare allocation runs under it: some runtimes refuse the tool);
#       5. runs the f32 gate (python3 scripts/f32_gate.py: host and cuda, per-node and
#          fused), scripts/bench_ae.py (with its host-fuse and cuda-fuse rows) and
#          scripts/bench_replay.py (cuda and host next to PyTorch eager and CUDA graphs).
#       Each stage has its own time limit, so a hang cannot eat the lease; the whole run is
#       about 6 minutes.  Logs go to $OUT (or /tmp/gpu_check), at most 9 files: summary.txt,
#       build.log, pytest.log, replay_check.log, sanitizer.log, bench.txt, bench_ae.json,
#       bench_replay.json, gate.json.  The summary comes last in the output.  Exit status: non-zero if
#       the build, a test or a check failed.
set -uo pipefail
cd "$(dirname "$0")/.."

GPU_DIR=.gpu
PYCUDA_VERSION=2026.1
PURE_WHEELS="pytools platformdirs mako jsonschema jsonschema-specifications referencing"
BINARY_WHEELS="siphash24 rpds-py"
PLATFORMS="--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64"

fetch() {
    set -e
    mkdir -p "$GPU_DIR"
    local exclude
    exclude="$(git rev-parse --git-path info/exclude)"
    mkdir -p "$(dirname "$exclude")"
    grep -qxF "/$GPU_DIR/" "$exclude" 2>/dev/null || echo "/$GPU_DIR/" >> "$exclude"
    # the sdist straight from the index's simple page (checked against the index's sha256):
    # `pip download` of an sdist builds its metadata, which needs setuptools' bdist_wheel
    # and PyCUDA's build requirements here, where nothing of it is compiled
    python3 - "$PYCUDA_VERSION" "$GPU_DIR" <<'EOF_PY'
import hashlib, os, re, sys, urllib.request
version, folder = sys.argv[1:]
name = f"pycuda-{version}.tar.gz"
page = urllib.request.urlopen("https://pypi.org/simple/pycuda/", timeout=60).read().decode()
found = re.search(r'href="([^"#]*/%s)#sha256=([0-9a-f]{64})"' % re.escape(name), page)
if not found:
    sys.exit(f"gpu_check: {name} is not on https://pypi.org/simple/pycuda/")
url, digest = found.groups()
data = urllib.request.urlopen(url, timeout=120).read()
if hashlib.sha256(data).hexdigest() != digest:
    sys.exit(f"gpu_check: {name}: sha256 differs from the index's")
tmp = os.path.join(folder, name + ".part")
with open(tmp, "wb") as f:
    f.write(data)
os.replace(tmp, os.path.join(folder, name))
print(f"gpu_check: {name} ({len(data)} bytes, sha256 checked)")
EOF_PY
    local py
    for py in 3.11 3.12 3.13; do
        # shellcheck disable=SC2086
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" \
            --implementation cp $PLATFORMS -d "$GPU_DIR" $BINARY_WHEELS
    done
    # shellcheck disable=SC2086
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp $PLATFORMS -d "$GPU_DIR" $PURE_WHEELS
    ls -l "$GPU_DIR"
    echo "now: device run with carry [\"$GPU_DIR\"], timeout_s 600, command 'bash scripts/gpu_check.sh'"
}

OUTDIR="${OUT:-/tmp/gpu_check}"
STATUS=0
SUMMARY=""
T0=$SECONDS

note() {     # one line for the summary (and now, on stdout)
    echo "gpu_check: $*"
    SUMMARY="$SUMMARY$*"$'\n'
}

fail() {
    note "FAILED: $*"
    STATUS=1
}

# the device call's limit is 10 minutes: past these marks the remaining stages are skipped
# (and reported), so the summary always comes back
past() {     # past SECONDS_MARK
    [ "$((SECONDS - T0))" -gt "$1" ]
}

finish() {
    {
        echo "== gpu_check summary ($(date -u +%FT%TZ))"
        printf '%s' "$SUMMARY"
        echo "== $([ "$STATUS" -eq 0 ] && echo passed || echo FAILED); logs in $OUTDIR"
    } | tee "$OUTDIR/summary.txt"
    exit "$STATUS"
}

find_cuda_root() {   # the toolkit folder holding include/cuda.h, from nvcc's real location
    local nvcc_real candidate
    nvcc_real="$(readlink -f "$(command -v nvcc)")"
    for candidate in "${CUDA_HOME:-}" "${CUDA_PATH:-}" "$(dirname "$(dirname "$nvcc_real")")" \
                     /usr/local/cuda /usr/local/cuda-*; do
        if [ -n "$candidate" ] && [ -f "$candidate/include/cuda.h" ]; then
            echo "$candidate"
            return 0
        fi
    done
    return 1
}

find_libcuda() {     # the driver's libcuda.so.1 (what PyCUDA links against and loads)
    local path
    path="$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 .*x86-64/ {print $NF; exit}')"
    if [ -z "$path" ]; then
        for path in /usr/local/nvidia/lib64/libcuda.so.1 /usr/lib/x86_64-linux-gnu/libcuda.so.1 \
                    /usr/lib64/libcuda.so.1 /usr/local/nvidia/lib/libcuda.so.1; do
            [ -e "$path" ] && break
            path=""
        done
    fi
    [ -n "$path" ] && echo "$path"
}

# setuptools compiles one extension's sources one after another; PyCUDA's _driver is ~40
# C++ files (Boost.Python included), so spread them over the cores
write_parallel_build() {
    cat > /tmp/gpu_check_setup.py <<'EOF'
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import setuptools  # noqa: F401 - selects setuptools' distutils

try:
    if os.environ.get("GPU_CHECK_SERIAL"):
        raise RuntimeError("GPU_CHECK_SERIAL is set")
    from distutils import ccompiler

    def parallel_compile(self, sources, output_dir=None, macros=None, include_dirs=None,
                         debug=0, extra_preargs=None, extra_postargs=None, depends=None):
        macros, objects, extra_postargs, pp_opts, build = self._setup_compile(
            output_dir, macros, include_dirs, sources, depends, extra_postargs)
        cc_args = self._get_cc_args(pp_opts, debug, extra_preargs)

        def one(obj):
            src, ext = build[obj]
            self._compile(obj, src, ext, cc_args, extra_postargs, pp_opts)

        with ThreadPoolExecutor(os.cpu_count() or 4) as pool:
            list(pool.map(one, objects))
        return objects

    ccompiler.CCompiler.compile = parallel_compile
except Exception as exc:  # noqa: BLE001 - fall back to the serial build
    print(f"gpu_check: serial PyCUDA build ({exc})", file=sys.stderr)

sys.path.insert(0, os.getcwd())          # setup.py imports aksetup_helper from its folder
sys.argv = ["setup.py", "build_ext", "--inplace"]
exec(compile(open("setup.py").read(), "setup.py", "exec"))
EOF
}

run() {
    if [ ! -d "$GPU_DIR" ] || ! ls "$GPU_DIR"/pycuda-*.tar.gz >/dev/null 2>&1; then
        echo "gpu_check: no PyCUDA sdist in $GPU_DIR/; run 'bash scripts/gpu_check.sh fetch'" \
             "on a machine with PyPI access and carry $GPU_DIR" >&2
        exit 2
    fi
    mkdir -p "$OUTDIR"
    export PYTHONUNBUFFERED=1
    T0=$SECONDS
    note "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"

    # 0. tools
    local pyver inc cuda_root libcuda
    pyver="$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    inc="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
    note "python3 $pyver ($(command -v python3)); nvcc: $(nvcc --version 2>&1 | tail -1)"
    if [ ! -f "$inc/Python.h" ]; then
        fail "no $inc/Python.h: the PyCUDA build needs CPython's headers (python$pyver-dev)"
        finish
    fi
    if ! cuda_root="$(find_cuda_root)"; then
        fail "no CUDA toolkit with include/cuda.h found (nvcc at $(command -v nvcc))"
        finish
    fi
    libcuda="$(find_libcuda || true)"
    note "CUDA toolkit $cuda_root; driver library ${libcuda:-not found by ldconfig}"

    # 1. dependencies and PyCUDA
    # shellcheck disable=SC2086
    if ! python3 -m pip install -q --no-index --no-deps --no-compile --upgrade \
            --find-links "$GPU_DIR" --target /tmp/site $PURE_WHEELS $BINARY_WHEELS \
            > "$OUTDIR/build.log" 2>&1; then
        tail -20 "$OUTDIR/build.log"
        fail "installing the wheels from $GPU_DIR for python $pyver (fetch brings 3.11-3.13)"
        finish
    fi
    export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
    # link against the toolkit's stub where there is one, else the driver's own library
    # (through an unversioned link: -lcuda looks for libcuda.so)
    local libdirs="$cuda_root/lib64/stubs,$cuda_root/lib/stubs,$cuda_root/lib64,$cuda_root/lib"
    if [ -n "$libcuda" ]; then
        mkdir -p /tmp/cudalink && ln -sf "$libcuda" /tmp/cudalink/libcuda.so
        libdirs="$libdirs,/tmp/cudalink"
    fi
    rm -rf /tmp/pycuda-src && mkdir -p /tmp/pycuda-src
    tar xzf "$GPU_DIR"/pycuda-*.tar.gz -C /tmp/pycuda-src --strip-components=1
    write_parallel_build
    local tb=$SECONDS
    if ! (cd /tmp/pycuda-src && python3 configure.py --cuda-root="$cuda_root" \
              --cudadrv-lib-dir="$libdirs" --no-cuda-enable-curand --cxxflags=-g0 \
          && { timeout 240 python3 /tmp/gpu_check_setup.py \
               || GPU_CHECK_SERIAL=1 timeout 300 python3 /tmp/gpu_check_setup.py; }) \
            >> "$OUTDIR/build.log" 2>&1; then
        tail -40 "$OUTDIR/build.log"
        fail "the PyCUDA $PYCUDA_VERSION build (log: build.log)"
        finish
    fi
    export PYTHONPATH="/tmp/pycuda-src:$PYTHONPATH"
    export PYCUDA_CACHE_DIR=/tmp/pycuda-cache     # its cubin cache, somewhere writable
    mkdir -p "$PYCUDA_CACHE_DIR"
    note "PyCUDA $PYCUDA_VERSION built in $((SECONDS - tb)) s"
    if ! python3 -c "from gradtool.device.cuda import cuda_status; ok, why = cuda_status(); print('gpu_check:', why); raise SystemExit(0 if ok else 1)"; then
        fail "PyCUDA does not see the GPU"
        finish
    fi

    # 2. tests: the CUDA files first (they must not skip here), then the host file and the CLI's
    local ts=$SECONDS
    timeout 270 python3 -m pytest -q -p no:cacheprovider -rs tests/test_device_cuda.py tests/test_masks.py tests/test_conv.py \
        tests/test_fusion.py tests/test_device_host.py tests/test_replay_cli.py \
        tests/test_numerics32.py::test_gt_real32_on_the_gpu_gives_the_numpy_bits \
        > "$OUTDIR/pytest.log" 2>&1 || fail "pytest (log: pytest.log)"
    grep -E "passed|failed|error" "$OUTDIR/pytest.log" | tail -1
    grep -E "^(FAILED|ERROR)" "$OUTDIR/pytest.log" | head -20
    if grep -q "no CUDA backend here" "$OUTDIR/pytest.log"; then
        fail "the CUDA tests were skipped"
    fi
    note "pytest: $(grep -E "passed|failed|error" "$OUTDIR/pytest.log" | tail -1) ($((SECONDS - ts)) s)"

    # 3. replay-gpu --check on every sample, six ways
    ts=$SECONDS
    : > "$OUTDIR/replay_check.log"
    local sample opts n_checks=0 n_failed=0
    for sample in samples/*.msgpack samples/*/*_f32.msgpack samples/lora_block/block.msgpack \
                  samples/autoencoder/ae.msgpack; do
        [ -e "$sample" ] || continue
        local ways=("" "--no-graph" "--train adam" "--dtype f32" "--fuse --train adam"
                    "--fuse --dtype f32 --train adam")
        case "$sample" in       # an f32 tape replays as f32 (bit for bit) without the flag
            *_f32.msgpack) ways=("" "--no-graph" "--train adam" "--fuse --train adam") ;;
        esac
        for opts in "${ways[@]}"; do
            n_checks=$((n_checks + 1))
            if past 330; then
                n_failed=$((n_failed + 1))
                fail "replay-gpu --check $sample $opts: skipped, out of time"
                continue
            fi
            echo "== $sample $opts" >> "$OUTDIR/replay_check.log"
            # shellcheck disable=SC2086
            if ! timeout 60 python3 -c "from gradtool.cli import main; main()" replay-gpu \
                    "$sample" --backend cuda --check --episodes 50 $opts \
                    >> "$OUTDIR/replay_check.log" 2>&1; then
                n_failed=$((n_failed + 1))
                fail "replay-gpu --check $sample $opts"
            fi
        done
    done
    note "replay-gpu --check: $((n_checks - n_failed)) of $n_checks passed ($((SECONDS - ts)) s)"

    # 4. out-of-bounds accesses (memcheck; a stray access inside the arena shows as wrong bits)
    local sanitizer
    sanitizer="$(command -v compute-sanitizer || ls "$cuda_root"/bin/compute-sanitizer 2>/dev/null || true)"
    : > "$OUTDIR/sanitizer.log"
    if past 360; then
        note "compute-sanitizer: skipped, out of time"
    elif [ -z "$sanitizer" ]; then
        note "compute-sanitizer: not installed, skipped"
    elif ! timeout 60 "$sanitizer" --tool memcheck --error-exitcode 3 python3 -c \
            "import pycuda.autoprimaryctx, pycuda.driver as d; d.mem_alloc(8).free()" \
            >> "$OUTDIR/sanitizer.log" 2>&1; then
        # some runtimes refuse the tool itself ("Device not supported"): that says nothing
        # about gradtool, so it is reported, not failed
        note "compute-sanitizer: unusable here (a bare allocation failed under it:" \
             "$(grep -v '^\s*$' "$OUTDIR/sanitizer.log" | tail -1 | cut -c1-160)), skipped"
    else
        ts=$SECONDS
        for sample in samples/attention.msgpack samples/lora_block/block.msgpack; do
            for opts in "--no-graph" "" "--fuse"; do
                # shellcheck disable=SC2086
                timeout 60 "$sanitizer" --tool memcheck --error-exitcode 3 python3 -c \
                    "from gradtool.cli import main; main()" replay-gpu "$sample" --backend cuda \
                    --train adam --episodes 3 --warmup 1 $opts >> "$OUTDIR/sanitizer.log" 2>&1 \
                    || fail "compute-sanitizer memcheck on $sample $opts (exit $?, log: sanitizer.log)"
            done
        done
        note "compute-sanitizer memcheck: $(($(grep -c "ERROR SUMMARY: 0 errors" "$OUTDIR/sanitizer.log") - 1)) of 6 runs clean ($((SECONDS - ts)) s)"
    fi

    # 5. the f32 gate, then the benchmarks (last, so their tables end the output)
    if past 440; then
        fail "f32 gate and benchmarks: skipped, out of time"
        finish
    fi
    ts=$SECONDS
    if timeout 60 python3 scripts/f32_gate.py --json > "$OUTDIR/gate.json" 2>&1; then
        note "f32 gate: passed ($(python3 -c "import json,sys; rows=json.load(open(sys.argv[1])); print('; '.join('%s %s loss %.3g params %.3g' % (r['backend'], 'fused' if r['fuse'] else 'per-node', r['loss_gap'], r['param_gap']) for r in rows))" "$OUTDIR/gate.json"))"
    else
        fail "f32 gate (log: gate.json)"
    fi
    timeout 90 python3 scripts/bench_ae.py --repeats 5 --json "$OUTDIR/bench_ae.json" \
        2>&1 | tee "$OUTDIR/bench.txt" || fail "bench_ae.py"
    timeout 90 python3 scripts/bench_replay.py --repeats 7 --steps 50 \
        --json "$OUTDIR/bench_replay.json" 2>&1 | tee -a "$OUTDIR/bench.txt" || fail "bench_replay.py"
    note "benchmarks: $((SECONDS - ts)) s (tables in bench.txt); whole run $((SECONDS - T0)) s"
    finish
}

case "${1:-run}" in
    fetch) fetch ;;
    run) run ;;
    *) echo "usage: bash scripts/gpu_check.sh [fetch|run]" >&2; exit 2 ;;
esac
