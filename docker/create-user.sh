#!/bin/sh
# The image's run-time user and directories (docs/CONVENTIONS.md, "Image layout"): user and group
# `vllm`, uid/gid 10001 (above any host range, so a bind mount never maps to a real host user);
# writable at run time only /tmp, /dev/shm and /home/vllm/.cache; user models mount at /models.
set -eu
groupadd --gid 10001 vllm
useradd --no-log-init --uid 10001 --gid 10001 --home-dir /home/vllm --create-home \
  --shell /usr/sbin/nologin vllm
mkdir -p /home/vllm/.cache /models /opt/vllm-intel/models
chown -R vllm:vllm /home/vllm
