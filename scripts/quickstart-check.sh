#!/usr/bin/env bash
# The README's quick start, run as written on this Debian machine, in fresh clones of HEAD:
#   root   as root with no sudo to be had (a `sudo` first on PATH fails the run if called);
#   user   as an ordinary user who may use sudo (made here: needs root, installs sudo).
# Each must build, install and end with the demo's PASS. CI runs both (.ci/run).
#   scripts/quickstart-check.sh [root] [user]          (default: both)
#   scripts/quickstart-check.sh --print                the two commands, as .ci/run reads them
set -euo pipefail
cd "$(dirname "$0")/.."

# The first two ```sh blocks after "## Quick start": the setup command, then the test command.
commands() {
    awk '/^## Quick start/ { on = 1; next } on && /^## / { exit }
         on && /^```sh$/ { inside = 1; next } inside && /^```$/ { inside = 0; print "--"; next }
         inside { print }' README.md
}
setup=$(commands | awk 'BEGIN { RS = "--\n" } NR == 1 { printf "%s", $0 }')
test_cmd=$(commands | awk 'BEGIN { RS = "--\n" } NR == 2 { printf "%s", $0 }')
if [ -z "$setup" ] || [ -z "$test_cmd" ]; then
    echo "quickstart: README.md's quick start lacks its two commands" >&2
    exit 1
fi
if [ "${1:-}" = --print ]; then
    printf '%s\n%s\n' "$setup" "$test_cmd"
    exit 0
fi

work=$(mktemp -d /tmp/clffn-quickstart.XXXXXX)
chmod 755 "$work"
trap 'rm -rf "$work"' EXIT

# Runs the setup command in the clone $1, through the runner given after it (nothing: this
# shell's user); the output goes to $1.log, and the demo must PASS.
run_setup() {
    local dir=$1
    shift
    "$@" env SETUP="$setup" bash -c 'cd "$0" && bash -c "$SETUP"' "$dir" >"$dir.log" 2>&1 || {
        tail -30 "$dir.log"
        echo "quickstart: the setup command failed ($dir.log above)" >&2
        return 1
    }
    grep -q "max error: .*PASS" "$dir.log" || {
        tail -30 "$dir.log"
        echo "quickstart: the demo did not pass" >&2
        return 1
    }
}

as_root() {
    [ "$(id -u)" = 0 ] || { echo "quickstart: the root check runs as root" >&2; return 1; }
    mkdir -p "$work/nosudo"
    printf '#!/bin/sh\necho "quickstart: sudo was called as root: $*" >&2\nexit 97\n' \
        >"$work/nosudo/sudo"
    chmod +x "$work/nosudo/sudo"
    git clone -q . "$work/root"
    PATH="$work/nosudo:$PATH" run_setup "$work/root"
    echo "quickstart: as root without sudo: built, installed, demo PASS"
}

as_user() {
    [ "$(id -u)" = 0 ] || { echo "quickstart: the user check needs root to make the user" >&2; return 1; }
    local user=clffn-quickstart rc=0
    if ! command -v sudo >/dev/null; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends sudo >/dev/null
    fi
    id "$user" >/dev/null 2>&1 || useradd -m "$user"
    echo "$user ALL=(ALL) NOPASSWD:ALL" >/etc/sudoers.d/clffn-quickstart
    chmod 440 /etc/sudoers.d/clffn-quickstart
    git clone -q . "$work/user"
    chown -R "$user" "$work/user"
    run_setup "$work/user" runuser -u "$user" -- || rc=$?
    rm -f /etc/sudoers.d/clffn-quickstart
    userdel -r "$user" 2>/dev/null || true
    [ "$rc" = 0 ] && echo "quickstart: as a user with sudo: built, installed, demo PASS"
    return "$rc"
}

for who in "${@:-root user}"; do
    for w in $who; do
        case $w in
        root) as_root ;;
        user) as_user ;;
        *) echo "usage: scripts/quickstart-check.sh [root] [user] | --print" >&2 && exit 2 ;;
        esac
    done
done
