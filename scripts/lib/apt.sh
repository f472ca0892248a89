# Sourced by scripts/setup.sh and scripts/test.sh: installs the Debian packages named (those
# the caller found missing) with apt-get, through sudo unless root; nothing when none.
# Usage: install_missing WHO PACKAGE...   (WHO prefixes the one line it prints)
install_missing() {
    local who=$1
    shift
    (($#)) || return 0
    echo "$who: installing $*"
    local sudo=""
    [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@"
}
