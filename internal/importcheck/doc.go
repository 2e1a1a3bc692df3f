// Package importcheck holds only a test: the library's packages must not
// depend on broker clients or test servers (see CONTRIBUTING.md). Packages
// made for one broker (kafka, amqp), examples and
// end-to-end tests may.
package importcheck
