// Package all registers every store driver this project ships with package
// [github.com/watermill-inbox/inbox/stores], for programs that open stores by
// URL and want any of them (cmd/inboxd does):
//
//	import _ "github.com/watermill-inbox/inbox/stores/all"
//
// Libraries should import only the drivers they use.
package all

import (
	_ "github.com/watermill-inbox/inbox/stores/memory"       // memory://
	_ "github.com/watermill-inbox/inbox/stores/mongo"        // mongodb://, mongodb+srv://
	_ "github.com/watermill-inbox/inbox/stores/redis"        // redis://, rediss://
	_ "github.com/watermill-inbox/inbox/stores/remote"       // http://, https://
	_ "github.com/watermill-inbox/inbox/stores/sql/mysql"    // mysql://
	_ "github.com/watermill-inbox/inbox/stores/sql/postgres" // postgres://, postgresql://
	_ "github.com/watermill-inbox/inbox/stores/sql/sqlite"   // sqlite://
)
