#!/usr/bin/env bash
# One command on a fresh machine: make .venv, install tflfuse with conversion support, build an
# offline example (a CNN trained on scikit-learn's digits, real labelled images shipped in the
# sklearn wheel), convert it for the Coral Edge TPU and for XNNPACK int8, predict the Edge TPU
# mapping, and benchmark fused vs unfused vs stock on this host. Nothing is downloaded but the
# Python packages. Results land in ./out/.
set -euo pipefail
cd "$(dirname "$0")"

python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[dev]"
tflfuse=.venv/bin/tflfuse   # quiet by default: add -v to see what TensorFlow prints
mkdir -p out

$tflfuse example digits_cnn -o out/digits.keras --calib out/digits_calib.npy
# --force: a second run replaces the results of the first (and nothing else)
$tflfuse convert out/digits.keras --recipe edgetpu --calib out/digits_calib.npy -o out/edgetpu --force
$tflfuse check out/edgetpu/model.tflite --target edgetpu
$tflfuse convert out/digits.keras --recipe xnnpack-int8 --calib out/digits_calib.npy -o out/xnnpack --force
$tflfuse bench out/xnnpack/model_unfused.tflite out/xnnpack/model_stock.tflite \
  out/xnnpack/model.tflite --runs 300 --json out/xnnpack/bench.json
echo
echo "Done. Reports: out/edgetpu/report.md, out/xnnpack/report.md, out/xnnpack/bench.json"
