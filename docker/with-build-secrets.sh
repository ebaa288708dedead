#!/bin/sh
# Run one build step with the optional build-time network settings, then forget them.
#
#   RUN --mount=type=secret,id=ca_bundle ... docker/with-build-secrets.sh CMD ARGS...
#
# Why: egress TLS is often intercepted (corporate proxies, these CI machines), so pip inside the
# build needs the host's CA bundle. It arrives as the BuildKit secret `ca_bundle`, which is mounted
# only for the duration of one RUN and never stored in a layer, the history or the final image.
# Proxies arrive as Docker's predefined build args (HTTP_PROXY, HTTPS_PROXY, NO_PROXY, lower-case
# too): they reach RUN steps without an ARG line and are likewise not recorded in the image.
set -eu
ca=/run/secrets/ca_bundle
if [ -s "$ca" ]; then
  export PIP_CERT="$ca" SSL_CERT_FILE="$ca" REQUESTS_CA_BUNDLE="$ca" CURL_CA_BUNDLE="$ca"
  # apt over https (e.g. Intel's repositories in Dockerfile.xpu) has its own setting.
  APT_CONFIG=$(mktemp /dev/shm/apt-ca.XXXXXX 2>/dev/null || mktemp)  # tmpfs: not in a layer
  echo "Acquire::https::CAInfo \"$ca\";" >"$APT_CONFIG"
  export APT_CONFIG
fi
exec "$@"
