#!/usr/bin/env bash
# The public API of the library crates, listed in a committed file per crate
# (crates/NAME/public-api.txt) so that every change to it shows in review (docs/public-api.md).
#
#   scripts/public-api.sh --check    fails with a diff when a listing differs from the code (CI)
#   scripts/public-api.sh --update   rewrites the listings from the code
#
# The listing is `cargo public-api` (crates.io `cargo-public-api`) on the rustdoc JSON of the
# crate with all its features, blanket implementations left out (`impl<T> Any for T` and the
# like: they follow from the rest). rustdoc JSON is a nightly format that changes, so both the
# nightly and the tool are pinned, to versions that understand each other (the tool's
# compatibility matrix); this script installs them when missing: the toolchain with rustup,
# the tool with `cargo install --locked` under target/tools.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The gated crates: one entry per library crate whose public API is listed.
crates=(syncmem syncmem-nn)

nightly=nightly-2026-05-20
tool_version=0.52.0

mode=${1:-}
case "$mode" in
    --check | --update) ;;
    *) echo "usage: scripts/public-api.sh --check | --update" >&2; exit 2 ;;
esac

if ! rustup run "$nightly" rustdoc --version >/dev/null 2>&1; then
    echo "public-api: installing the $nightly toolchain"
    rustup toolchain install "$nightly" --profile minimal
fi

tools=$PWD/target/tools
if ! "$tools/bin/cargo-public-api" --version 2>/dev/null | grep -qx "cargo-public-api $tool_version"; then
    echo "public-api: installing cargo-public-api $tool_version under target/tools"
    # A debug build: half the compile time of a release build (CI pays it on a fresh machine),
    # and the listing takes as long (rustdoc is most of it).
    env -u CARGO_TARGET_DIR cargo install --quiet --locked --debug --force --root "$tools" \
        "cargo-public-api@$tool_version"
fi
export PATH="$tools/bin:$PATH"

# Nightly rustdoc output in a directory of its own: it never invalidates the regular builds.
export CARGO_TARGET_DIR=$PWD/target/public-api
out=$CARGO_TARGET_DIR/listings
mkdir -p "$out"

status=0
for crate in "${crates[@]}"; do
    listing=crates/$crate/public-api.txt
    cargo +"$nightly" public-api --package "$crate" --all-features --simplified --color never \
        >"$out/$crate.txt"
    if [ "$mode" = --update ]; then
        if cmp -s "$out/$crate.txt" "$listing"; then
            echo "public-api: $listing is up to date"
        else
            cp "$out/$crate.txt" "$listing"
            echo "public-api: $listing rewritten"
        fi
    elif ! diff -u --label "$listing (committed)" --label "$listing (from the code)" \
        "$listing" "$out/$crate.txt"; then
        echo "public-api: the public API of $crate differs from $listing (diff above);" \
            "if the change is meant, run scripts/public-api.sh --update and commit the listing" >&2
        status=1
    fi
done
exit "$status"
