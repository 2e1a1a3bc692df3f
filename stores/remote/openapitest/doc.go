// Package openapitest checks the reference server of the remote inbox
// protocol (package stores/remote/server) against the protocol's OpenAPI
// document, stores/remote/openapi.yaml: every request the client sends and
// every answer the server gives during the store conformance suite, and the
// error answers, must be valid. It is its own module so that kin-openapi and
// its dependencies stay out of the library's go.mod.
package openapitest
