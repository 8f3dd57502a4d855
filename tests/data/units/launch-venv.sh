#!/usr/bin/env bash
# launch script: activate the release's virtualenv, then start the server
set -euo pipefail
source /opt/sglang-0.5.23/bin/activate
export NCCL_DEBUG=WARN
python -m sglang.launch_server --model-path /models/Kimi-K2.6 \
  --tp-size 8 --port 30000
