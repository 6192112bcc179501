package ddblease

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
)

// topLevel returns the text of expr outside every parenthesis, and false if
// the parentheses do not balance.
func topLevel(expr string) (string, bool) {
	var b strings.Builder
	depth := 0
	for i := 0; i < len(expr); i++ {
		switch c := expr[i]; {
		case c == '(':
			if depth == 0 {
				b.WriteString("()")
			}
			depth++
		case c == ')':
			depth--
			if depth < 0 {
				return "", false
			}
		case depth == 0:
			b.WriteByte(c)
		}
	}
	return b.String(), depth == 0
}

// FuzzGuardCondition feeds arbitrary caller conditions to the guard's
// condition builder: whatever it accepts must leave the guard's checks
// ANDed at the top level with the caller's condition, inside parentheses
// of its own; it must never panic.
func FuzzGuardCondition(f *testing.F) {
	for _, s := range []string{
		"", "attribute_not_exists(pk)", "attribute_exists(pk)) OR (attribute_exists(pk)", "a) OR (b", "((a)",
		"#ddbleaseFence > :v", "size(#n) > :v AND (x = :y OR z IN (:a, :b))", ")(", "\x00(",
	} {
		f.Add(s)
	}
	g, err := NewGuard(dynamodb.New(dynamodb.Options{}), "table", "job") // never called: a client the constructor accepts
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, cond string) {
		c, names, values, err := g.mark.condition("Put", aws.String(cond), nil, nil, 3, "tok")
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("refusal %v does not wrap ErrInvalid", err)
			}
			return
		}
		top, ok := topLevel(*c)
		if !ok {
			t.Fatalf("unbalanced result %q", *c)
		}
		want := "() AND ()"
		if strings.TrimSpace(cond) != "" {
			want += " AND ()"
		}
		if top != want {
			t.Fatalf("condition %q escaped: top level of %q is %q", cond, *c, top)
		}
		if names[fenceName] != attrFence || names[tokenName] != DefaultGuardTokenAttribute {
			t.Fatalf("names %v", names)
		}
		if v, ok := values[fenceValue].(*types.AttributeValueMemberN); !ok || v.Value != "3" {
			t.Fatalf("values %v", values)
		}
	})
}

func TestCheckCondition(t *testing.T) {
	for cond, ok := range map[string]bool{
		"":                         true,
		"attribute_exists(pk)":     true,
		"(a = :a) OR (b IN (:b))":  true,
		"a) OR (b":                 false,
		"(a":                       false,
		"a)":                       false,
		"#DDBLEASEfence = :x":      false,
		"a = :ddbleaseanything":    false,
		"#ddblease = :ddbleas":     false,
		"#ddbleas = :v AND (x)":    true,
		"contains(#n, :ddbleas_x)": true,
	} {
		err := checkCondition(cond)
		if ok != (err == nil) {
			t.Errorf("checkCondition(%q) = %v", cond, err)
		}
		if err != nil && !errors.Is(err, ErrInvalid) {
			t.Errorf("checkCondition(%q): %v does not wrap ErrInvalid", cond, err)
		}
	}
}

// The classification of errors that decides what is retried, and how each
// request is reported to an observer.
func TestConflictClassification(t *testing.T) {
	api := func(code string, fault smithy.ErrorFault) error {
		return fmt.Errorf("op: %w", &smithy.GenericAPIError{Code: code, Fault: fault})
	}
	canceled := func(codes ...string) error {
		var rs []types.CancellationReason
		for _, c := range codes {
			rs = append(rs, types.CancellationReason{Code: aws.String(c)})
		}
		return fmt.Errorf("op: %w", &types.TransactionCanceledException{CancellationReasons: rs})
	}
	for _, c := range []struct {
		name               string
		err                error
		conflicted, doubt  bool
		write, read        CallOutcome
		retryable, mismtch bool
	}{
		{"conflict on the lease check", canceled("TransactionConflict", "None"), true, false, CallError, CallError, true, false},
		{"throttled transaction", canceled("None", "ThrottlingError"), true, false, CallError, CallError, true, false},
		{"condition failed", canceled("ConditionalCheckFailed", "TransactionConflict"), false, false, CallConditionFailed, CallConditionFailed, false, false},
		{"validation", canceled("None", "ValidationError"), false, false, CallError, CallError, false, false},
		{"no reasons", canceled(), false, false, CallError, CallError, true, false},
		// A plain write (a heartbeat) refused because a transaction uses
		// its item: transient, so the lease side retries it.
		{"TransactionConflictException", &types.TransactionConflictException{}, true, false, CallError, CallError, true, false},
		{"TransactionInProgressException", api("TransactionInProgressException", smithy.FaultClient), true, false, CallError, CallError, true, false},
		{"IdempotentParameterMismatch", &types.IdempotentParameterMismatchException{}, false, false, CallError, CallError, false, true},
		{"throttled", api("ThrottlingException", smithy.FaultClient), false, false, CallThrottled, CallThrottled, true, false},
		{"server error", api("InternalServerError", smithy.FaultServer), false, true, CallInDoubt, CallError, true, false},
		{"timeout", context.DeadlineExceeded, false, true, CallInDoubt, CallError, true, false},
		{"condition", &types.ConditionalCheckFailedException{}, false, false, CallConditionFailed, CallConditionFailed, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := conflicted(c.err); got != c.conflicted {
				t.Errorf("conflicted = %v", got)
			}
			if got := callOutcome("TransactWriteItems", c.err); got != c.write {
				t.Errorf("callOutcome(write) = %v, want %v", got, c.write)
			}
			if got := callOutcome("GetItem", c.err); got != c.read {
				t.Errorf("callOutcome(read) = %v, want %v", got, c.read)
			}
			if got := retryable(c.err); got != c.retryable {
				t.Errorf("retryable = %v", got)
			}
			if got := mismatch(c.err); got != c.mismtch {
				t.Errorf("mismatch = %v", got)
			}
		})
	}
	if callOutcome("PutItem", nil) != CallOK {
		t.Error("nil is not ok")
	}
}

func TestRefersTo(t *testing.T) {
	names := map[string]string{"#f": "fence", "#o": "other", "#ff": "x"}
	for expr, want := range map[string]string{
		"SET a = :v":                   "",
		"SET fence = :v":               "fence",
		"SET a = :v REMOVE #f":         "#f",
		"SET a.fence = :v":             "",
		"SET a[0].fence = :v, b = :w":  "",
		"SET a = :v, #o.fence = :w":    "",
		"SET #ff = :v":                 "",
		"SET b = fence":                "fence",
		"SET b = list_append(#f, :l)":  "#f",
		"ADD fences :one":              "",
		"SET #o = :fence":              "",
		"SET  fence.x = :v":            "fence",
		"SET a = if_not_exists(fence)": "fence",
	} {
		ref, ok := refersTo(expr, names, "fence")
		if ref != want || ok != (want != "") {
			t.Errorf("refersTo(%q) = %q, %v; want %q", expr, ref, ok, want)
		}
	}
}

// A TableName is compared by the table's name, whether it gives the name
// or the table's ARN; a malformed ARN is compared as it is.
func TestTableName(t *testing.T) {
	for in, want := range map[string]string{
		"leases": "leases",
		"arn:aws:dynamodb:eu-west-1:123456789012:table/leases":               "leases",
		"arn:aws-cn:dynamodb:cn-north-1:123456789012:table/leases":           "leases",
		"arn:aws:dynamodb:eu-west-1:123456789012:table/leases/index/byOwner": "leases",
		"arn:aws:dynamodb:eu-west-1:123456789012:table/":                     "arn:aws:dynamodb:eu-west-1:123456789012:table/",
		"arn:aws:dynamodb:eu-west-1:123456789012:table":                      "arn:aws:dynamodb:eu-west-1:123456789012:table",
		"arn:aws:s3:::leases":     "arn:aws:s3:::leases",
		"arn::dynamodb:::table/x": "arn::dynamodb:::table/x",
		"arn:":                    "arn:",
		"arn:aws:dynamodb":        "arn:aws:dynamodb",
		"":                        "",
	} {
		if got := tableName(in); got != want {
			t.Errorf("tableName(%q) = %q, want %q", in, got, want)
		}
	}
	if !sameTable("leases", "arn:aws:dynamodb:us-east-1:1:table/leases") || sameTable("leases", "arn:aws:dynamodb:us-east-1:1:table/leases2") {
		t.Error("sameTable compares by name")
	}
}
