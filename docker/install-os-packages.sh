#!/bin/sh
# apt-get install PACKAGES... with no recommends, for the OS stages of both Dockerfiles and the
# shared app stage (tini).
# /var/cache/apt and /var/lib/apt are BuildKit cache mounts (sharing=locked), so a rebuild does
# not download again and the image keeps no package lists or .debs.
set -eu
export DEBIAN_FRONTEND=noninteractive
# Keep the downloaded .debs in the cache mount (the slim image's docker-clean hook deletes them).
rm -f /etc/apt/apt.conf.d/docker-clean
echo 'Binary::apt::APT::Keep-Downloaded-Packages "true";' >/etc/apt/apt.conf.d/keep-cache
# Files no container process reads, left unpacked (dpkg's path-exclude; the licences stay).
# Measured on the CPU image (make bench, section image): g++ and binutils bring translations, the
# LTO compiler and dumper (only for -flto) and the sanitizer runtimes (only for -fsanitize=...);
# python3-dev brings a static libpython (only for embedding Python), libc6-dev and libstdc++-dev
# static archives (only for -static), binutils the gold linker and dwp. inductor builds its CPU
# kernels as shared objects with g++ and ld.bfd and needs none of them (tests/container: the image
# serves in torch.compile mode).
cat >/etc/dpkg/dpkg.cfg.d/vllm-intel-excludes <<'EOF_CFG'
path-exclude=/usr/share/doc/*
path-include=/usr/share/doc/*/copyright
path-exclude=/usr/share/man/*
path-exclude=/usr/share/info/*
path-exclude=/usr/share/locale/*
path-exclude=/usr/lib/gcc/x86_64-linux-gnu/*/lto1
path-exclude=/usr/bin/*lto-dump*
path-exclude=/usr/lib/x86_64-linux-gnu/libasan.so*
path-exclude=/usr/lib/x86_64-linux-gnu/liblsan.so*
path-exclude=/usr/lib/x86_64-linux-gnu/libtsan.so*
path-exclude=/usr/lib/x86_64-linux-gnu/libubsan.so*
path-exclude=/usr/lib/x86_64-linux-gnu/libhwasan.so*
path-exclude=/usr/lib/gcc/x86_64-linux-gnu/*/lib*san*
path-exclude=/usr/lib/python3*/config-*/libpython*.a
path-exclude=/usr/lib/x86_64-linux-gnu/libc.a
path-exclude=/usr/lib/x86_64-linux-gnu/libm-*.a
path-exclude=/usr/lib/x86_64-linux-gnu/libmvec.a
path-exclude=/usr/lib/gcc/x86_64-linux-gnu/*/libstdc++.a
path-exclude=/usr/bin/*ld.gold
path-exclude=/usr/bin/*dwp
EOF_CFG
apt-get update -qq
apt-get install -y -qq --no-install-recommends "$@"
