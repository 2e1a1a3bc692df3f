package mongostore

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/stores"
)

// The servers of these tests run without authentication, so the
// classification of the server's refusals is checked on the errors the
// driver returns for them.
func TestCheckError_classifies_refusals(t *testing.T) {
	t.Parallel()
	c, err := mongo.Connect(options.Client().ApplyURI("mongodb://127.0.0.1:1/"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Disconnect(context.Background())
	s, err := newStore(c, Options{Database: "app"})
	if err != nil {
		t.Fatal(err)
	}
	withUser, _ := url.Parse("mongodb://app:pw-s3cret@db1:27017/app?authSource=admin")
	noUser, _ := url.Parse("mongodb://db1:27017/app")
	ctx := context.Background()
	for _, tc := range []struct {
		name          string
		u             *url.URL
		err           error
		misconfigured bool
		want          string
	}{
		{"authentication failed", withUser, mongo.CommandError{Code: 18, Name: "AuthenticationFailed", Message: "Authentication failed."},
			true, "authentication failed for user app (authentication database admin) at db1:27017: check the user and password in the URL"},
		{"not authorized", withUser, mongo.CommandError{Code: 13, Name: "Unauthorized", Message: "not authorized on app to execute command"},
			true, "user app may not read collection app.inbox at db1:27017: grant it the readWrite role on database app"},
		{"authentication required", noUser, mongo.CommandError{Code: 13, Name: "Unauthorized", Message: "command find requires authentication"},
			true, "the server at db1:27017 requires authentication: add user and password to the URL"},
		{"other server error", withUser, mongo.CommandError{Code: 91, Name: "ShutdownInProgress", Message: "shutting down"},
			false, "cannot reach db1:27017"},
		{"network", withUser, errors.New("dial tcp db1:27017: connect: connection refused pw-s3cret"),
			false, "cannot reach db1:27017"},
	} {
		err := s.b.checkError(ctx, tc.u, "reading collection app.inbox", tc.err)
		if !errors.Is(err, inbox.ErrStoreUnavailable) || errors.Is(err, stores.ErrMisconfigured) != tc.misconfigured {
			t.Errorf("%s: %v; want ErrStoreUnavailable, misconfigured %v", tc.name, err, tc.misconfigured)
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error does not say %q: %v", tc.name, tc.want, err)
		}
		if strings.Contains(err.Error(), "pw-s3cret") {
			t.Errorf("%s: error quotes the password: %v", tc.name, err)
		}
	}
}
