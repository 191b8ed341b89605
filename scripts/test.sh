#!/usr/bin/env bash
# Checks formatting and lints, then runs every test of the project, setting up what they need on
# a fresh machine:
#   - PostgreSQL server binaries (installed with apt-get only when missing);
#   - Chromium and chromedriver for the dashboard's browser tests (likewise);
#   - a Python virtual environment with the official client (tests/compat/requirements.txt);
#   - the shared PostgreSQL test cluster, which the test harness starts under target/ and this
#     script stops when the tests end.
# Extra arguments go to the test runner (e.g. `scripts/test.sh -E 'test(fusion)'` with nextest).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
target=${CARGO_TARGET_DIR:-$root/target}
case "$target" in /*) ;; *) target="$root/$target" ;; esac

have_pg_binaries() {
    compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || command -v initdb >/dev/null
}
if ! have_pg_binaries; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "PostgreSQL server binaries are missing; install them (apt-get install postgresql) and rerun." >&2
        exit 1
    fi
    echo "== installing PostgreSQL server binaries"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi

# Chromium and its WebDriver, for the dashboard's browser tests (tests/dashboard).
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "Chromium or chromedriver is missing; install them (apt-get install chromium chromium-driver) and rerun." >&2
        exit 1
    fi
    echo "== installing Chromium and chromedriver"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
fi

# promtool, to check the Prometheus output: taken out of Debian's prometheus package without
# installing it (installing would also start a Prometheus server).
promtool=$(command -v promtool || true)
if [ -z "$promtool" ]; then
    promtool="$target/tools/prometheus/usr/bin/promtool"
    if [ ! -x "$promtool" ]; then
        echo "== fetching promtool from Debian's prometheus package"
        mkdir -p "$target/tools"
        (cd "$target/tools" && { apt-get download prometheus >/dev/null 2>&1 || { apt-get update -qq && apt-get download prometheus >/dev/null; }; } \
            && dpkg-deb -x prometheus_*.deb prometheus && rm -f prometheus_*.deb)
    fi
fi
export QUEEN_PROMTOOL="$promtool"

venv="$target/compat-venv"
requirements=tests/compat/requirements.txt
if [ ! -x "$venv/bin/python" ] || ! cmp -s "$requirements" "$venv/requirements.txt"; then
    echo "== creating $venv with $(tr '\n' ' ' <"$requirements")"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$requirements"
    cp "$requirements" "$venv/requirements.txt"
fi
export QUEEN_COMPAT_PYTHON="$venv/bin/python"

# The shared test cluster, the TLS-only one (tests of TLS to PostgreSQL) and the one recording
# statements (tests of the SQL the broker sends).
stop_test_clusters() {
    local pg_ctl data
    pg_ctl=$(compgen -G "/usr/lib/postgresql/*/bin/pg_ctl" | sort -V | tail -n 1 || true)
    pg_ctl=${pg_ctl:-$(command -v pg_ctl)}
    for data in "$target/queen-test-pg" "$target/queen-test-pg-tls/pg" "$target/queen-test-pg-statements"; do
        [ -f "$data/postmaster.pid" ] || continue
        if [ "$(id -u)" -eq 0 ]; then
            runuser -u "$(stat -c %U "$data")" -- "$pg_ctl" -D "$data" -m fast -w stop >/dev/null || true
        else
            "$pg_ctl" -D "$data" -m fast -w stop >/dev/null || true
        fi
    done
}
trap stop_test_clusters EXIT

# Style and lints first, so that neither can drift.
cargo fmt --version >/dev/null 2>&1 || rustup component add rustfmt
cargo clippy --version >/dev/null 2>&1 || rustup component add clippy
echo "== cargo fmt --check and cargo clippy -D warnings"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# queen-client is a library for others: its docs build without a warning and its examples compile.
echo "== queen-client: cargo doc -D warnings and doctests"
RUSTDOCFLAGS="-D warnings" cargo doc -p queen-client --no-deps --quiet
cargo test --doc -p queen-client --quiet

if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --workspace --profile ci "$@"
else
    cargo test --workspace "$@"
fi
