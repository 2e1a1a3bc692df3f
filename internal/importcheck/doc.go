// Package importcheck holds only tests of what the library's packages link
// (see CONTRIBUTING.md): none depends on broker clients or test servers
// (packages made for one broker, kafka and amqp, examples and end-to-end
// tests may), and a program that imports one store's package links that
// store's driver and no other store's (stores/all, which registers them
// all, excepted). testdata/size holds the programs whose sizes
// BENCHMARKS.md compares.
package importcheck
