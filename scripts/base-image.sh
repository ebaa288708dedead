#!/usr/bin/env bash
# Build the CPU image's base without a registry: debootstrap a minimal Debian and `docker import`
# it under exactly the name Dockerfile.cpu's FROM uses by default, so the Dockerfile stays the same
# as it is where a registry is reachable (there, `docker pull debian:bookworm-slim` does the job).
# Skips if the tag exists. Needs root, debootstrap (installed if missing) and a Docker engine
# (DOCKER_HOST, see scripts/docker-engine.sh).
#
#   scripts/base-image.sh [TAG]      (default: debian:bookworm-slim)
set -euo pipefail
tag=${1:-debian:bookworm-slim}
suite=${DEBIAN_SUITE:-bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
docker=${DOCKER:-/usr/bin/docker}

if "$docker" image inspect "$tag" >/dev/null 2>&1; then
  echo "base-image: $tag exists" >&2; exit 0
fi
if ! command -v debootstrap >/dev/null; then
  echo "base-image: installing debootstrap" >&2
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >&2
fi
rootfs=$(mktemp -d /tmp/base-image.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT
echo "base-image: debootstrap --variant=minbase $suite -> $tag" >&2
debootstrap --variant=minbase "$suite" "$rootfs" "$mirror" >&2
# What the slim image adds and a bare debootstrap lacks: updates/security sources and no caches.
cat >"$rootfs/etc/apt/sources.list" <<EOF
deb $mirror $suite main
deb $mirror $suite-updates main
deb ${mirror%/debian}/debian-security $suite-security main
EOF
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb
# And what slim leaves out (debuerreotype's slimify: docs but the licences, man pages,
# translations), also for the packages the Dockerfiles install later.
cat >"$rootfs/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/overrides/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/man/*
EOF
find "$rootfs/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
rm -rf "$rootfs"/usr/share/{groff,info,linda,locale,man}/* "$rootfs"/usr/share/lintian/overrides/*
tar -C "$rootfs" --numeric-owner -c . | "$docker" import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["bash"]' \
  --message "debootstrap --variant=minbase $suite $mirror" - "$tag" >&2
echo "base-image: built $tag" >&2
