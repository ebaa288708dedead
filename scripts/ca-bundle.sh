#!/bin/sh
# The CA bundle pip must trust on this host (TLS-intercepting networks), for image builds and for
# tests inside the test image: $CA_BUNDLE, else $PIP_CERT, else the system bundle. Prints nothing
# for CA_BUNDLE=none or a missing/empty file.
ca=${CA_BUNDLE:-${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}}
if [ "$ca" != none ] && [ -s "$ca" ]; then echo "$ca"; fi
