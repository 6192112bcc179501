package main

import (
	"fmt"
	"strings"

	"github.com/ddblease/ddblease"
)

// tableDefinitions renders the lease table, as ddblease.LeaseTableSpec
// describes it, as a CloudFormation resource and a Terraform resource.
// docs/deploy.md shows this output for the table "leases" (a test checks
// that it matches).
func tableDefinitions(table string) string {
	s := ddblease.LeaseTableSpec()
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
          AttributeType: %s
      KeySchema:
        - AttributeName: %s
          KeyType: HASH
      TimeToLiveSpecification:
        AttributeName: %s
        Enabled: true

`, table, s.BillingMode, s.PartitionKey, s.PartitionKeyType, s.PartitionKey, s.TTLAttribute)
	fmt.Fprintf(&b, `# Terraform (HCL)
resource "aws_dynamodb_table" "leases" {
  name         = %q
  billing_mode = %q
  hash_key     = %q

  attribute {
    name = %q
    type = %q
  }

  ttl {
    attribute_name = %q
    enabled        = true
  }

  lifecycle {
    prevent_destroy = true
  }
}
`, table, s.BillingMode, s.PartitionKey, s.PartitionKey, s.PartitionKeyType, s.TTLAttribute)
	return b.String()
}
