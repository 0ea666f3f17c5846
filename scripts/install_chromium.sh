#!/usr/bin/env bash
# Install Debian's headless Chromium and its driver for the docs site's browser test
# (tests/test_site.py). Debian's packages only: never a browser build downloaded by a tool
# (`playwright install` and the like), which would fetch from outside the package registries.
#
# Does nothing when /usr/bin/chromium is already there. Needs root, or sudo without a password.
set -euo pipefail

if [ -x /usr/bin/chromium ]; then
  echo "install_chromium.sh: $(/usr/bin/chromium --version 2>/dev/null || echo chromium) already installed"
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "install_chromium.sh: no apt-get here; install Chromium by hand (the browser test skips without it)" >&2
  exit 2
fi
if [ "$(id -u)" -eq 0 ]; then
  as_root=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  as_root=(sudo -n)
else
  echo "install_chromium.sh: needs root or passwordless sudo for apt-get" >&2
  exit 2
fi

# apt verifies signatures as its unprivileged _apt user, which writes a temporary file to $TMPDIR
# (/tmp by default). Where /tmp is not world-writable (some containers) that fails with "Couldn't
# create temporary file" and the lists are never updated; a sticky, world-writable folder of our own fixes it.
tmp=$(mktemp -d)
chmod 1777 "$tmp"
trap 'rm -rf "$tmp"' EXIT
"${as_root[@]}" env TMPDIR="$tmp" DEBIAN_FRONTEND=noninteractive apt-get update -qq
"${as_root[@]}" env TMPDIR="$tmp" DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -qq --no-install-recommends chromium chromium-driver fonts-dejavu-core
/usr/bin/chromium --version
