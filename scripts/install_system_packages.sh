#!/bin/sh
# Installs the Debian/Ubuntu packages listed in system-packages.txt that are missing.
# As root: apt-get installs them. Otherwise: prints the exact command and exits 1, so that
# `make test` stops before the tests instead of skipping the real parts.
#   sh scripts/install_system_packages.sh           install (root) or say what to run
#   sh scripts/install_system_packages.sh --check   only say what is missing (exit 1 if any)
set -eu
cd "$(dirname "$0")/.."
list=${GPUFLEET_SYSTEM_PACKAGES:-system-packages.txt}  # another list: for the tests of this script
wanted=$(sed -e 's/#.*//' "$list" | tr -s ' \t' '\n' | grep -v '^$')

if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "install_system_packages: no dpkg here (not Debian/Ubuntu); install the equivalents of:" >&2
  echo "  $(echo $wanted)" >&2
  echo "  the tests that need one of them say which when it is missing." >&2
  exit 0
fi

missing=""
for pkg in $wanted; do
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  case "$status" in
    *" installed") ;;
    *) missing="$missing $pkg" ;;
  esac
done
missing=${missing# }
[ -z "$missing" ] && exit 0

command="apt-get update && apt-get install -y --no-install-recommends $missing"
if [ "${1:-}" = "--check" ] || [ "$(id -u)" -ne 0 ]; then
  echo "missing system packages (from $list): $missing" >&2
  echo "install them with:" >&2
  echo "  sudo sh -c '$command'" >&2
  echo "or run this as root: sudo sh scripts/install_system_packages.sh" >&2
  exit 1
fi
echo "installing system packages (from $list): $missing" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086  # one word per package, on purpose
apt-get install -y -qq --no-install-recommends $missing >/dev/null
