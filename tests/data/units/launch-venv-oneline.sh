#!/bin/sh
. /srv/venvs/vllm-0.30.0/bin/activate && exec vllm serve /models/tiny --max-model-len 512 --port 8000
