// Package e2e holds the end-to-end tests of watermill-inbox: a real broker
// (RabbitMQ, Kafka), a real store, and real failures. See README.md.
package e2e
