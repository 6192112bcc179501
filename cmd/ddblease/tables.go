package main

import (
	"fmt"
	"strings"

	"github.com/ddblease/ddblease"
)

// tableDefinitions renders the lease table of layout y, as
// Layout.TableSpec describes it, as a CloudFormation resource and a
// Terraform resource. docs/deploy.md shows this output for the table
// "leases" of the default layout (a test checks that it matches).
func tableDefinitions(table string, y ddblease.Layout) (string, error) {
	s, err := y.TableSpec()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, `# CloudFormation (YAML)
Resources:
  LeaseTable:
    Type: AWS::DynamoDB::Table
    DeletionPolicy: Retain
    Properties:
      TableName: %s
      BillingMode: %s
      AttributeDefinitions:
        - AttributeName: %s
          AttributeType: S
        - AttributeName: %s
          AttributeType: S
      KeySchema:
        - AttributeName: %s
          KeyType: HASH
        - AttributeName: %s
          KeyType: RANGE
      TimeToLiveSpecification:
        AttributeName: %s
        Enabled: true

`, table, s.BillingMode, s.PartitionKey, s.SortKey, s.PartitionKey, s.SortKey, s.TTLAttribute)
	fmt.Fprintf(&b, `# Terraform (HCL)
resource "aws_dynamodb_table" "leases" {
  name         = %q
  billing_mode = %q
  hash_key     = %q
  range_key    = %q

  attribute {
    name = %q
    type = "S"
  }

  attribute {
    name = %q
    type = "S"
  }

  ttl {
    attribute_name = %q
    enabled        = true
  }

  lifecycle {
    prevent_destroy = true
  }
}
`, table, s.BillingMode, s.PartitionKey, s.SortKey, s.PartitionKey, s.SortKey, s.TTLAttribute)
	return b.String(), nil
}
