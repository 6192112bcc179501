package ddbleasetest

import (
	"encoding/json"
	"net/http"
)

// minidynOps are the operations minidyn serves; serialized answers any
// other with DynamoDB's UnknownOperationException, as JSON the SDK reads,
// where minidyn answers with a line of text.
var minidynOps = map[string]bool{
	"CreateTable": true, "UpdateTable": true, "DeleteTable": true, "DescribeTable": true,
	"PutItem": true, "DeleteItem": true, "UpdateItem": true, "GetItem": true,
	"Query": true, "Scan": true, "BatchWriteItem": true, "BatchGetItem": true,
	"TransactWriteItems": true, "TransactGetItems": true,
}

// ttls holds each table's time-to-live setting, which minidyn has no call
// for: UpdateTimeToLive records it and DescribeTimeToLive reports it
// (ENABLED or DISABLED), as DynamoDB does. No item is ever deleted for
// its expiry, which DynamoDB also only does eventually (typically within a
// few days). Guarded by serialized's lock.
type ttls map[string]string

// serve answers one DescribeTimeToLive or UpdateTimeToLive (op), and
// reports false for any other operation.
func (t ttls) serve(h http.Handler, w http.ResponseWriter, op string, body []byte) bool {
	if op != "DescribeTimeToLive" && op != "UpdateTimeToLive" {
		return false
	}
	var req struct {
		TableName string
		Spec      *struct {
			AttributeName string
			Enabled       bool
		} `json:"TimeToLiveSpecification"`
	}
	if err := json.Unmarshal(body, &req); err != nil || req.TableName == "" {
		writeJSON(w, http.StatusBadRequest, jsonError("com.amazon.coral.validate#ValidationException",
			"ddbleasetest: "+op+": the request names no TableName"))
		return true
	}
	// The table must exist: DynamoDB answers ResourceNotFoundException.
	if status, resp := call(h, "DescribeTable", mustJSON(map[string]string{"TableName": req.TableName})); status != http.StatusOK {
		writeJSON(w, status, resp)
		return true
	}
	if op == "UpdateTimeToLive" {
		if req.Spec == nil || req.Spec.AttributeName == "" {
			writeJSON(w, http.StatusBadRequest, jsonError("com.amazon.coral.validate#ValidationException",
				"ddbleasetest: UpdateTimeToLive: the request has no TimeToLiveSpecification.AttributeName"))
			return true
		}
		if req.Spec.Enabled {
			t[req.TableName] = req.Spec.AttributeName
		} else {
			delete(t, req.TableName)
		}
		writeJSON(w, http.StatusOK, mustJSON(map[string]any{"TimeToLiveSpecification": req.Spec}))
		return true
	}
	desc := map[string]string{"TimeToLiveStatus": "DISABLED"}
	if attr, ok := t[req.TableName]; ok {
		desc = map[string]string{"TimeToLiveStatus": "ENABLED", "AttributeName": attr}
	}
	writeJSON(w, http.StatusOK, mustJSON(map[string]any{"TimeToLiveDescription": desc}))
	return true
}

// unknownOp answers an operation minidyn does not serve.
func unknownOp(w http.ResponseWriter, op string) {
	writeJSON(w, http.StatusBadRequest, jsonError("com.amazonaws.dynamodb.v20120810#UnknownOperationException",
		"ddbleasetest: the in-process server (minidyn) does not serve "+op))
}

func jsonError(typ, msg string) []byte {
	return mustJSON(map[string]string{"__type": typ, "message": msg})
}

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
