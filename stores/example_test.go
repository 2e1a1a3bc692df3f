package stores_test

import (
	"errors"
	"fmt"
	"net/url"

	"github.com/watermill-inbox/inbox/stores"
)

// A driver whose URLs carry a secret in a parameter whose name does not
// say so registers it (in its init function), and Redact and Scrub mask
// it, with the password and the parameters that say they are secret.
func ExampleRegisterSecretParams() {
	stores.RegisterSecretParams("signature") // a driver of this example's
	u, _ := url.Parse("mystore://app:hunter2@db.internal/inbox?signature=c2lnbmVk&api_key=k3y&table=inbox")
	fmt.Println(stores.Redact(u))

	driverErr := errors.New(`connect "app:hunter2@db.internal" with signature c2lnbmVk: refused`)
	fmt.Println(stores.Scrub(driverErr.Error(), u))
	fmt.Println(stores.SecretParam("Signature"), stores.SecretParam("table"))
	// Output:
	// mystore://app:xxxxx@db.internal/inbox?api_key=xxxxx&signature=xxxxx&table=inbox
	// connect "app:xxxxx@db.internal" with signature xxxxx: refused
	// true false
}
