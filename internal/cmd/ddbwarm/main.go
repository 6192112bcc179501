// Command ddbwarm warms a freshly started DynamoDB-compatible server (a JVM
// such as DynamoDB Local answers its first requests slowly): it creates a
// table, sends the kinds of request the tests send until a round of them
// answers quickly (after a least number of rounds), and deletes the table.
//
//	go run ./internal/cmd/ddbwarm -endpoint http://127.0.0.1:8000
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/ddblease/ddblease/ddbleasetest"
)

func main() {
	endpoint := flag.String("endpoint", "http://127.0.0.1:8000", "the server to warm")
	quick := flag.Duration("quick", 50*time.Millisecond, "a round is quick when each of its requests answers within this")
	least := flag.Int("least", 30, "send at least this many rounds, so that the JIT has compiled the request paths")
	rounds := flag.Int("rounds", 300, "give up after this many rounds")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("ddbwarm: ")

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	db := ddbleasetest.Endpoint(*endpoint).Client(nil)
	table := "ddbwarm-" + ddbleasetest.RandomID()
	if err := ddbleasetest.CreateKeyTable(ctx, db, table, "pk", types.ScalarAttributeTypeS); err != nil {
		log.Fatalf("create table %s: %v", table, err)
	}
	defer func() {
		if _, err := db.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(table)}); err != nil {
			log.Printf("delete table %s: %v", table, err)
		}
	}()
	start := time.Now()
	for i := 1; i <= *rounds; i++ {
		slowest, err := round(ctx, db, table, i)
		if err != nil {
			log.Printf("round %d: %v", i, err)
			os.Exit(1)
		}
		if i >= *least && slowest <= *quick {
			fmt.Printf("ddbwarm: %s warm after %d rounds (%s); the last round's slowest request took %s\n",
				*endpoint, i, time.Since(start).Round(time.Millisecond), slowest.Round(time.Microsecond))
			return
		}
	}
	log.Printf("%s still slow after %d rounds", *endpoint, *rounds)
	os.Exit(1)
}

// round sends one of each kind of request and returns the slowest time.
func round(ctx context.Context, db *dynamodb.Client, table string, i int) (time.Duration, error) {
	key := map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "warm#" + strconv.Itoa(i%10)}}
	n := &types.AttributeValueMemberN{Value: strconv.Itoa(i)}
	var slowest time.Duration
	timed := func(f func() error) error {
		t := time.Now()
		err := f()
		slowest = max(slowest, time.Since(t))
		return err
	}
	steps := []func() error{
		func() error {
			_, err := db.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table),
				Item: map[string]types.AttributeValue{"pk": key["pk"], "n": n}})
			return err
		},
		func() error {
			_, err := db.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: aws.String(table), Key: key,
				UpdateExpression:          aws.String("SET n = :n"),
				ConditionExpression:       aws.String("n <= :n"),
				ExpressionAttributeValues: map[string]types.AttributeValue{":n": n}})
			return err
		},
		func() error { // refused on purpose: the condition-failure path
			_, err := db.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table),
				Item:                                map[string]types.AttributeValue{"pk": key["pk"]},
				ConditionExpression:                 aws.String("attribute_not_exists(pk)"),
				ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld})
			var ccf *types.ConditionalCheckFailedException
			if errors.As(err, &ccf) {
				return nil
			}
			return fmt.Errorf("a conditional put on an existing item was not refused: %v", err)
		},
		func() error {
			_, err := db.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(table), Key: key, ConsistentRead: aws.Bool(true)})
			return err
		},
		func() error {
			_, err := db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{
				{ConditionCheck: &types.ConditionCheck{TableName: aws.String(table), Key: key,
					ConditionExpression: aws.String("attribute_exists(pk)")}},
				{Put: &types.Put{TableName: aws.String(table), Item: map[string]types.AttributeValue{
					"pk": &types.AttributeValueMemberS{Value: "warm-tx#" + strconv.Itoa(i%10)}, "n": n}}},
			}})
			var unknown interface{ ErrorCode() string }
			if errors.As(err, &unknown) && unknown.ErrorCode() == "UnknownOperationException" {
				return nil // a server without transactions (dynalite)
			}
			return err
		},
	}
	for _, s := range steps {
		if err := timed(s); err != nil {
			return 0, err
		}
	}
	return slowest, nil
}
