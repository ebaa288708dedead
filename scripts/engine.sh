# shellcheck shell=bash
# Sourced by .ci/run and .buildkite/steps/lib.sh (run from the repository root): use the Docker
# engine that answers, else start ours; release_engine stops it again only if we started it.
_engine_started=0

use_engine() {  # exports DOCKER_HOST
  if ! DOCKER_HOST=$(scripts/docker-engine.sh status 2>/dev/null); then
    _engine_started=1
    DOCKER_HOST=$(scripts/docker-engine.sh start) || return 1
  fi
  export DOCKER_HOST
}

release_engine() {
  if [ "$_engine_started" = 1 ]; then scripts/docker-engine.sh stop || true; fi
}
