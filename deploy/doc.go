// Package deploy holds the deployment files of Charon and their tests: the
// Envoy and Istio examples (decoded into go-control-plane's types and run
// through their generated validation, since Envoy does not run in the
// tests), the Kubernetes manifests and the Helm chart (decoded strictly into
// k8s.io/api types), the Compose example and the image's Dockerfile (read
// with Docker's own parser, and its build stage run). It is a module of its
// own, so that Helm, Kubernetes and BuildKit stay out of the product's
// go.mod.
package deploy
