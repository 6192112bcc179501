package ddblease

import (
	"errors"
	"fmt"
	"testing"

	awsretry "github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/stretchr/testify/assert"
)

// logText says what happened instead of the SDK's attempt count, on one
// line, for wrapped and joined errors alike.
func TestLogText(t *testing.T) {
	once := fmt.Errorf("operation error DynamoDB: UpdateItem, %w", &awsretry.MaxAttemptsError{Attempt: 1, Err: errors.New("StatusCode: 500, boom")})
	thrice := fmt.Errorf("operation error DynamoDB: GetItem, %w", &awsretry.MaxAttemptsError{Attempt: 3, Err: errors.New("throttled")})
	for _, c := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("ddblease: write lease %q: %w", "j", once), `ddblease: write lease "j": operation error DynamoDB: UpdateItem, StatusCode: 500, boom`},
		{thrice, "operation error DynamoDB: GetItem, throttled (the last of 3 attempts)"},
		{errors.Join(once, thrice), "operation error DynamoDB: UpdateItem, StatusCode: 500, boom | operation error DynamoDB: GetItem, throttled (the last of 3 attempts)"},
		{errors.New("a\n\n\tb\r\nc "), "a | b | c"},
		{(*HeldError)(nil), "ddblease: a nil *ddblease.HeldError was returned as a non-nil error"},
	} {
		assert.Equal(t, c.want, logText(c.err))
	}
}
