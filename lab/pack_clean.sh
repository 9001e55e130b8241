#!/usr/bin/env bash
# Pack the committed tree for a device call: lab/pack_clean.sh [REV]
# The device copies the working tree as it is, a helper's uncommitted edits included; this
# writes `git archive REV` (default HEAD) of src, tests, lab, docs, README.md and
# pyproject.toml (the doc-contract tests read the docs: `pytest -m gpu tests/` collects them) and the
# wheels of .whl/ into .clean/ (ignored). The committed results travel with the tree
# (the call's limit is 64 MiB in all): --resume reads them as ../benchmarks/results/...
# Then: run(command="cd .clean && KERNELLAB_GIT_SHA=<sha> bash lab/gpu_call.sh ...",
# carry=[".clean"]). Prints the short SHA the rows should carry.
set -eu
rev=${1:-HEAD}
cd "$(git rev-parse --show-toplevel)"
rm -rf .clean && mkdir .clean
git archive "$rev" src tests lab docs README.md pyproject.toml | tar -x -C .clean
[ -d .whl ] && cp -r .whl .clean/
du -sh .clean >&2
git rev-parse --short=7 "$rev"
