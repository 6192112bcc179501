package ddblease_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/internal/ddbtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Two applications keep their leases in one table of a single-table
// design (keys PK and SK, the table's other items their own), each with a
// prefix of its own: the same job and pool names in both, and neither sees
// the other's items, fences or runs.
func TestTwoLayoutsShareATable(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 30*time.Second)
	layoutOf := func(prefix string) ddblease.Layout {
		return ddblease.Layout{PartitionKey: "PK", SortKey: "SK", Prefix: prefix}
	}
	table := srv.NewTable(t, func(y *ddblease.Layout) { *y = layoutOf("") })
	db := srv.Client(nil)
	user := map[string]types.AttributeValue{"PK": sAttr("job#billing"), "SK": sAttr("lease"), "note": sAttr("the team's own item")}
	putRaw(t, db, table, user) // where an unprefixed library would write

	slot := time.Date(2026, 11, 30, 2, 0, 0, 0, time.UTC)
	acquisitions := map[string]int{"app-a#": 1, "app-b#": 3}
	for prefix, n := range acquisitions {
		y := layoutOf(prefix)
		inLayout := func(o *ddblease.Options) { o.Layout = y }
		for i := range n {
			l := newLease(t, db, table, "billing", fast(prefix+"replica"), inLayout)
			fence, err := l.TryAcquire(ctx)
			require.NoError(t, err)
			require.Equal(t, int64(i+1), fence, "%s: fences of its own", prefix)
			run, err := l.Claim(ctx, slot.Add(time.Duration(i)*time.Hour))
			require.NoError(t, err)
			require.NoError(t, run.Finish(ctx, nil))
			require.NoError(t, l.Resign(ctx))
		}
		p := newPool(t, db, table, []string{"r1", "r2"}, fast(prefix+"member"), inLayout)
		stop := async(ctx, func(ctx context.Context) error {
			return p.Run(ctx, func(ctx context.Context, _ string, _ int64) error { <-ctx.Done(); return nil })
		})
		eventually(t, "the pool leads its jobs", func() bool { return p.Lease("r1").IsLeader() && p.Lease("r2").IsLeader() })
		require.NoError(t, stop())
	}

	for prefix, n := range acquisitions {
		y := layoutOf(prefix)
		admin, err := ddblease.NewAdmin(db, table, func(o *ddblease.AdminOptions) { o.Layout = y })
		require.NoError(t, err)
		jobs, err := admin.Jobs(ctx)
		require.NoError(t, err)
		var names []string
		for _, j := range jobs {
			names = append(names, j.Job)
		}
		assert.Equal(t, []string{"billing", "r1", "r2"}, names, prefix)
		st, err := admin.Job(ctx, "billing")
		require.NoError(t, err)
		assert.Equal(t, int64(n), st.Lease.Fence, "%s sees its own fence", prefix)
		assert.Equal(t, prefix+"replica", st.Lease.Owner)
		runs, err := admin.Runs(ctx, "billing", ddblease.RunRange{})
		require.NoError(t, err)
		assert.Len(t, runs, n, "%s sees its own runs", prefix)
		pools, err := admin.Pools(ctx)
		require.NoError(t, err)
		require.Len(t, pools, 1)
		assert.Equal(t, "reports", pools[0].Name)
		assert.Equal(t, []string{"r1", "r2"}, pools[0].Jobs)

		// A guard of one application checks that application's fence.
		g, err := ddblease.NewGuard(db, table, "billing", func(o *ddblease.GuardOptions) { o.Layout = y })
		require.NoError(t, err)
		require.NoError(t, g.Check(ctx, int64(n)))
		if n > 1 {
			staleFence(t, g.Check(ctx, 1), 1, int64(n))
		}
	}

	// Every item of the table is the user's, or has one of the prefixes.
	out, err := db.Scan(ctx, &dynamodb.ScanInput{TableName: aws.String(table)})
	require.NoError(t, err)
	for _, it := range out.Items {
		pk := it["PK"].(*types.AttributeValueMemberS).Value
		if pk == "job#billing" {
			assert.Equal(t, user, it, "the team's own item is untouched")
			continue
		}
		assert.True(t, strings.HasPrefix(pk, "app-a#") || strings.HasPrefix(pk, "app-b#"), "item %q", pk)
	}
}

// A table whose key schema is not the one the layout needs is refused
// with an error naming what was found and what is needed, by CreateTable
// and at the first request of a Lease, an Admin or a Guard: a table made
// for the previous layout (a partition key alone) says to make a new one.
func TestLayoutSchemaRefused(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 30*time.Second)
	db := srv.Client(nil)
	old := "ddblease-old-" + ddbtest.RandomID()
	require.NoError(t, ddbtest.CreateRawTable(ctx, db, old, "pk", types.ScalarAttributeTypeS))
	other := srv.NewTable(t, func(y *ddblease.Layout) { y.PartitionKey, y.SortKey = "PK", "SK" })

	refused := func(t *testing.T, err error, found string, more ...string) {
		t.Helper()
		require.ErrorIs(t, err, ddblease.ErrTableSchema)
		assert.ErrorContains(t, err, found)
		assert.ErrorContains(t, err, `partition key "pk" (S) and sort key "sk" (S)`)
		for _, m := range more {
			assert.ErrorContains(t, err, m)
		}
	}
	for table, want := range map[string][]string{
		old:   {`partition key "pk"`, "older layout", "create a new table"},
		other: {`partition key "PK"`, "set Layout's PartitionKey and SortKey"},
	} {
		t.Run(table, func(t *testing.T) {
			refused(t, ddblease.CreateTable(ctx, db, table), want[0], want[1:]...)
			l := newLease(t, db, table, "billing", fast("a"))
			_, err := l.TryAcquire(ctx)
			refused(t, err, want[0], want[1:]...)
			err = l.Run(ctx, func(context.Context, int64) error { t.Error("fn called"); return nil })
			refused(t, err, want[0])
			_, err = newAdmin(t, db, table).Jobs(ctx)
			refused(t, err, want[0])
			_, err = newAdmin(t, db, table).Runs(ctx, "billing", ddblease.RunRange{})
			refused(t, err, want[0])
			g, err := ddblease.NewGuard(db, table, "billing")
			require.NoError(t, err)
			err = g.Check(ctx, 1)
			refused(t, err, want[0])
		})
	}
	// With the table's own names, the same table is fine.
	l := newLease(t, db, other, "billing", fast("a"), func(o *ddblease.Options) { o.Layout.PartitionKey, o.Layout.SortKey = "PK", "SK" })
	_, err := l.TryAcquire(ctx)
	require.NoError(t, err)
}

// A layout that cannot work is refused by every constructor, naming the
// field, before any request.
func TestLayoutValidation(t *testing.T) {
	t.Parallel()
	db := srv.Client(nil)
	for name, c := range map[string]struct {
		y    ddblease.Layout
		want string
	}{
		"same names":        {ddblease.Layout{PartitionKey: "k", SortKey: "k"}, `PartitionKey and SortKey are both "k"`},
		"default collision": {ddblease.Layout{SortKey: "pk"}, `PartitionKey and SortKey are both "pk"`},
		"an attribute":      {ddblease.Layout{PartitionKey: "owner"}, `Layout.PartitionKey "owner" is an attribute of the library's items`},
		"the ttl":           {ddblease.Layout{SortKey: ddblease.RunTTLAttribute}, `Layout.SortKey "ttl" is an attribute`},
		"control character": {ddblease.Layout{Prefix: "a\nb"}, "Layout.Prefix"},
		"long prefix":       {ddblease.Layout{Prefix: strings.Repeat("x", ddblease.MaxKeyPrefix+1)}, "Layout.Prefix is 257 bytes long"},
	} {
		t.Run(name, func(t *testing.T) {
			check := func(err error) {
				t.Helper()
				require.ErrorIs(t, err, ddblease.ErrInvalid)
				assert.ErrorContains(t, err, c.want)
			}
			_, err := ddblease.New(db, "leases", "job", func(o *ddblease.Options) { o.Layout = c.y })
			check(err)
			_, err = ddblease.NewPool(db, "leases", "pool", []string{"a"}, func(o *ddblease.Options) { o.Layout = c.y })
			check(err)
			_, err = ddblease.NewAdmin(db, "leases", func(o *ddblease.AdminOptions) { o.Layout = c.y })
			check(err)
			_, err = ddblease.NewGuard(db, "leases", "job", func(o *ddblease.GuardOptions) { o.Layout = c.y })
			check(err)
			_, err = c.y.TableSpec()
			check(err)
			check(ddblease.CreateTable(context.Background(), db, "leases", func(y *ddblease.Layout) { *y = c.y }))
		})
	}
}
