#!/usr/bin/env bash
# Builds target/debian/myjob_<version>_<arch>.deb, and its debug symbols apart in
# myjob-dbgsym_<version>_<arch>.ddeb, with cargo-deb from a release build: the binary, the
# template unit, the myjob system user (sysusers.d), /etc/myjob/myjob.toml as a conffile, the
# man pages and bash, zsh and fish completions made by `myjob generate` from the same clap
# definitions as --help, the README, docs/ and the examples. Prints the package's path.
#   pkg/build-deb.sh [cargo-deb options], e.g. --deb-revision 99 --output DIR for a test upgrade.
# Installs cargo-deb (with cargo) the first time. Run from anywhere.
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO_DEB_VERSION=3.8.0

if [ "$(cargo deb --version 2>/dev/null)" != "cargo-deb $CARGO_DEB_VERSION" ]; then
  echo "build-deb: installing cargo-deb $CARGO_DEB_VERSION" >&2
  cargo install --quiet --locked --version "$CARGO_DEB_VERSION" cargo-deb
fi
cargo build --release --quiet
# The examples ship as the repository has them: a run of the Python example (the tests', the
# benchmark's) leaves its bytecode beside it, which the package must not carry.
find examples -name __pycache__ -type d -prune -exec rm -rf {} +

assets=target/assets
rm -rf "$assets"
mkdir -p "$assets/man" "$assets/completions"
target/release/myjob generate man "$assets/man"
target/release/myjob generate completions bash > "$assets/completions/myjob.bash"
target/release/myjob generate completions zsh > "$assets/completions/_myjob"
target/release/myjob generate completions fish > "$assets/completions/myjob.fish"

# --dbgsym: the binary stripped, its debug lines (profile.release's debug) in the .ddeb.
# cargo-deb prints the paths of both; this prints the package's.
out=$(cargo deb --no-build --dbgsym --quiet "$@")
grep '\.deb$' <<<"$out"
