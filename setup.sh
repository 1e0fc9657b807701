#!/usr/bin/env bash
# One command on a fresh machine: make .venv, install tflfuse with conversion support, build an
# offline example where fusion matters (MobileNetV3-Small, 96x96, Keras weights=None with its
# BatchNorm statistics calibrated so that outputs vary with the input), convert it for the Coral
# Edge TPU, and compare the three models the conversion gives -- unfused (the network as written),
# stock (the plain TFLite converter) and fused (tflfuse) -- on op count, latency on this host,
# predicted Edge TPU mapping and error against the Keras model. Nothing is downloaded but the
# Python packages. Results land in ./out/ (a second run replaces them, and nothing else).
set -euo pipefail
cd "$(dirname "$0")"

python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[dev]"
tflfuse=.venv/bin/tflfuse   # quiet by default: add -v to see what TensorFlow prints
mkdir -p out

$tflfuse example mobilenet_v3_small -o out/mobilenet_v3_small.keras --calib out/calib.npy --force
$tflfuse convert out/mobilenet_v3_small.keras --recipe edgetpu --calib out/calib.npy \
  -o out/edgetpu --force
echo
$tflfuse compare out/edgetpu --runs 300 --plot out/latency.png --json out/compare.json
echo
echo "Done. Report: out/edgetpu/report.md; the table as JSON: out/compare.json."
echo "More: tflfuse check out/edgetpu/model_stock.tflite --target edgetpu (where stock is cut)."
