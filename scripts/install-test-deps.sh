#!/usr/bin/env bash
# System packages that the test suite needs, installed with apt-get.
#
# Run by .ci/run (as root, on Debian). Idempotent: packages already installed
# are not touched, and nothing runs apt-get when all are present. Without
# root (a developer's machine) it only says what is missing; the tests that
# need a missing service skip themselves.
#
#   openssh-server   a real sshd for the ssh backend's tests
#   slurmctld slurmd slurm-client munge
#                    a real one-node Slurm cluster for the slurm backend's tests;
#                    its setup (munged, slurm.conf, the daemons) is private to
#                    the tests and made by tests/support/slurmd.py, not here
#   chromium         a real headless browser for the status page's test
#                    (tests/integration/test_status_page.py drives it over the DevTools protocol)
#   prometheus       a real Prometheus that scrapes the service's /metrics (tests/integration/test_metrics.py)
#   tmux             a real terminal for the live displays' test (tests/integration/test_cli_screen.py)
#   postgresql       a real PostgreSQL for the shared repository's tests (the API suite on PostgreSQL, the
#                    active/standby pair); tests/support/postgres.py runs a private cluster of its own with
#                    initdb and pg_ctl, and the server the package starts is left alone
set -euo pipefail

# Two OS users with a login shell, for the tests about users (jobs run as their owners, ssh logs in as the
# owner): orch-alice and orch-bob. Made once, as root; without root the tests that need them skip.
TEST_USERS=(orch-alice orch-bob)
make_test_users() {
    [ "$(id -u)" -eq 0 ] || return 0
    command -v useradd >/dev/null 2>&1 || return 0
    for user in "${TEST_USERS[@]}"; do
        id -u "$user" >/dev/null 2>&1 || useradd -m -s /bin/bash "$user"
        # Password "*": no password login, but not locked ("!"), which sshd refuses to key logins without PAM.
        usermod --password '*' "$user"
    done
}
make_test_users

PACKAGES=(openssh-server slurmctld slurmd slurm-client munge chromium tmux prometheus postgresql)

installed() {
    if command -v dpkg-query >/dev/null 2>&1; then
        dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"
    else
        return 1
    fi
}

missing=()
for pkg in "${PACKAGES[@]}"; do
    installed "$pkg" || missing+=("$pkg")
done

if [ "${#missing[@]}" -eq 0 ]; then
    echo "install-test-deps: already installed: ${PACKAGES[*]}"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "install-test-deps: not root, not installing: ${missing[*]} (tests that need them will skip)" >&2
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-test-deps: no apt-get, not installing: ${missing[*]} (tests that need them will skip)" >&2
    exit 0
fi

echo "install-test-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
