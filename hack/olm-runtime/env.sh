# shellcheck shell=bash
# Shared settings for the OLM runtime scripts (build, up, e2e). Sourced, not executed.
here_olm_env="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/cluster/env.sh
source "$here_olm_env/../cluster/env.sh"
# The versions go.mod pins; the cache directory is keyed by them.
export OLM_VERSION="v0.46.0"
export OPM_VERSION="v1.73.0"
export OLM_BIN="$COXSWAIN_CACHE/olm-runtime/olm-$OLM_VERSION-opm-$OPM_VERSION/bin"
# The module directory of the pinned OLM release (its CRDs live there).
olm_module_dir() {
  (cd "$here_olm_env" && go list -m -f '{{.Dir}}' github.com/operator-framework/operator-lifecycle-manager)
}
