#!/usr/bin/env bash
# k9s (github.com/derailed/k9s, built from Go modules by hack/upstream.sh) against a running
# cluster, in a tmux pane as a user sees it: it opens on the pods of NAMESPACE, and the pane's
# screen is printed (tmux capture-pane). Exits non-zero unless every pod the API lists for the
# namespace shows on the screen.
#   KUBECONFIG=… bash hack/k9s.sh [NAMESPACE]     (default: kube-system)
source "$(dirname "$0")/lib.sh"
NS="${1:-kube-system}"
[ -n "${KUBECONFIG:-}" ] || die "set KUBECONFIG to the cluster's kubeconfig"
command -v tmux >/dev/null || { log "installing tmux"; apt-get install -y -qq tmux >/dev/null; }
"$ROOT/hack/upstream.sh" k9s
K9S="$ROOT/target/upstream/bin/k9s"
session="minik8s-k9s-$$"
home="$(mktemp -d)"
trap 'tmux kill-session -t "$session" 2>/dev/null || true; rm -rf "$home"' EXIT
# Its own config and state folders, a known terminal size, no logo or crumbs in the way.
tmux new-session -d -s "$session" -x 160 -y 40 \
  "env HOME=$home XDG_CONFIG_HOME=$home/config XDG_STATE_HOME=$home/state XDG_DATA_HOME=$home/data TERM=xterm-256color KUBECONFIG=$KUBECONFIG $K9S --namespace $NS --command pods --headless --logoless --readonly"
pods="$(kubectl get pods -n "$NS" -o jsonpath='{.items[*].metadata.name}')"
screen=""
for _ in $(seq 60); do
  sleep 1
  screen="$(tmux capture-pane -p -t "$session")"
  missing=0
  for p in $pods; do grep -q "$p" <<<"$screen" || missing=1; done
  [ "$missing" = 0 ] && [ -n "$pods" ] && break
done
printf '%s\n' "$screen"
for p in $pods; do
  grep -q "$p" <<<"$screen" || die "k9s does not show pod $p of $NS"
done
[ -n "$pods" ] || die "the namespace $NS has no pods to show"
log "k9s shows all $(wc -w <<<"$pods") pods of $NS"
