package main

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/watermill-inbox/inbox/cmd/inboxctl/internal/cli"
	"github.com/watermill-inbox/inbox/stores"
	_ "github.com/watermill-inbox/inbox/stores/all"
	sqlstore "github.com/watermill-inbox/inbox/stores/sql"
	mysqldialect "github.com/watermill-inbox/inbox/stores/sql/mysql"
	pgdialect "github.com/watermill-inbox/inbox/stores/sql/postgres"
	sqlitedialect "github.com/watermill-inbox/inbox/stores/sql/sqlite"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// run is inboxctl with its arguments, over every store this project ships;
// it returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	return cli.Run(ctx, args, cli.Env{
		Stdout: stdout, Stderr: stderr, Getenv: getenv,
		Open:     stores.Open,
		Migrator: migrator(),
	})
}

// migrator gives the migrate command the SQL store's schema.
func migrator() *cli.Migrator {
	return &cli.Migrator{
		Dialects: map[string]string{
			pgdialect.Scheme:           string(sqlstore.Postgres),
			pgdialect.SchemePostgreSQL: string(sqlstore.Postgres),
			mysqldialect.Scheme:        string(sqlstore.MySQL),
			sqlitedialect.Scheme:       string(sqlstore.SQLite),
		},
		DefaultTable: sqlstore.DefaultTable,
		DDL: func(dialect, table string) (string, error) {
			return sqlstore.DDL(sqlstore.Dialect(dialect), table)
		},
		MigrateParam: "migrate",
	}
}
