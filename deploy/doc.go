// Package deploy holds deployment examples (Envoy, Istio); it has no code.
// Its tests decode the examples into go-control-plane's types and run their
// generated validation, since Envoy itself does not run in the tests.
package deploy
