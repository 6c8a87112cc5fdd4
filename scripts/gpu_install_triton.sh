# Sourced by the device scripts after scripts/gpu_install.sh, from the repository root, with
# $OUT set: installs the Triton plugin (plugins/unimatmul-triton) so that its entry point
# exists there and its kernels are candidates.
if ! python3 -m pip install -q --no-deps --no-build-isolation --no-index -e plugins/unimatmul-triton >>"$OUT/install.log" 2>&1; then
    # Offline without setuptools: a hand-made dist-info gives the plugin its entry point.
    site=$(mktemp -d)
    mkdir -p "$site/unimatmul_triton-0.1.0.dist-info"
    ln -sfn "$PWD/plugins/unimatmul-triton/src/unimatmul_triton" "$site/unimatmul_triton"
    ln -sfn "$PWD/conformance/unimatmul_conformance" "$site/unimatmul_conformance"
    printf 'Metadata-Version: 2.1\nName: unimatmul-triton\nVersion: 0.1.0\n' >"$site/unimatmul_triton-0.1.0.dist-info/METADATA"
    printf '[unimatmul]\ntriton = unimatmul_triton\n' >"$site/unimatmul_triton-0.1.0.dist-info/entry_points.txt"
    export PYTHONPATH="$site:${PYTHONPATH:-}"
    echo "plugin editable install failed; using a hand-made dist-info" | tee -a "$OUT/install.log"
fi
