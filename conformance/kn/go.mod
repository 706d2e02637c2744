// The Knative client, `kn`, built from Go modules by hack/upstream.sh: the release the module
// proxy serves whole (kn v0.42.0; later releases name a `knative.dev/client/pkg` module the
// proxy does not serve).
module minik8s.local/kn

go 1.24

require knative.dev/client v0.42.0
