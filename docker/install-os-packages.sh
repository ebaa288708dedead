#!/bin/sh
# apt-get install PACKAGES... with no recommends, for the base stage of both Dockerfiles.
# /var/cache/apt and /var/lib/apt are BuildKit cache mounts (sharing=locked), so a rebuild does
# not download again and the image keeps no package lists or .debs.
set -eu
export DEBIAN_FRONTEND=noninteractive
# Keep the downloaded .debs in the cache mount (the slim image's docker-clean hook deletes them).
rm -f /etc/apt/apt.conf.d/docker-clean
echo 'Binary::apt::APT::Keep-Downloaded-Packages "true";' >/etc/apt/apt.conf.d/keep-cache
apt-get update -qq
apt-get install -y -qq --no-install-recommends "$@"
