# Sourced by the device scripts, from the repository root, with $OUT set: installs
# unimatmul so that its entry points exist there ("built-ins through the front door"),
# and logs the versions found.
# Sourced again by a part of scripts/gpu_session.sh: installed once per checkout already.
if [ "${GPU_INSTALLED_AT:-}" = "$PWD" ]; then
    return 0
fi
# nvmath-python (cuBLASLt's bindings), where the call carried its wheel in .whl/
# (carried with the device call): installed apart, and on the path of every part; compiled
# to bytecode as a user's pip install is (uncompiled, its imports cost seconds a process).
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
# The package, installed for its entry points ("built-ins through the front door").
if ! python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >"$OUT/install.log" 2>&1; then
    # No usable setuptools offline: a dist-info by hand gives the same entry points.
    site=/tmp/unimatmul-site
    mkdir -p "$site/unimatmul-0.dev0.dist-info"
    ln -sfn "$PWD/unimatmul" "$site/unimatmul"
    ln -sfn "$PWD/backends" "$site/unimatmul_backends"
    printf 'Metadata-Version: 2.1\nName: unimatmul\nVersion: 0.dev0\n' >"$site/unimatmul-0.dev0.dist-info/METADATA"
    python3 - "$site" <<'PY'
import sys, tomllib
eps = tomllib.load(open("pyproject.toml", "rb"))["project"]["entry-points"]["unimatmul"]
with open(f"{sys.argv[1]}/unimatmul-0.dev0.dist-info/entry_points.txt", "w") as fh:
    fh.write("[unimatmul]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()))
PY
    export PYTHONPATH="$site:${PYTHONPATH:-}"
    echo "editable install failed (see install.log); using a hand-made dist-info" | tee -a "$OUT/install.log"
fi
python3 - <<'PY' 2>&1 | tee "$OUT/env.log"
import importlib.metadata as md, torch, unimatmul
print("entry points:", sorted(e.name for e in md.entry_points(group="unimatmul")))
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())
for name in ("nvmath-python", "cuda-bindings", "cuda-core", "cuda-pathfinder", "nvidia-cublas", "setuptools"):
    try:
        print(name, md.version(name))
    except md.PackageNotFoundError:
        print(name, "missing")
PY
