package apisix

import (
	"bytes"
	"encoding/json"
	"net/http"
	"regexp"
	"strconv"
	"strings"

	"github.com/confshim/confshim/rewrite"
)

// What APISIX's answers to a configs PUT say, read in one place: confshim matches on
// APISIX's message text nowhere else. The messages are APISIX's own (spec §2, §4; the
// captures in testdata/apisix-wire).

// conflictMessage is the version check's refusal (spec §2.3):
// "<section>_conf_version must be greater than or equal to (<n>)".
const conflictMessage = "_conf_version must be greater than or equal to"

// IsConflict: APISIX refused a PUT for a version below the one it holds.
func IsConflict(a *Answer) bool {
	return a.Status == http.StatusBadRequest && bytes.Contains(a.Body, []byte(conflictMessage))
}

// ErrorMessage is an answer's error_msg, or "" when the body is not that JSON.
func ErrorMessage(body []byte) string {
	var e struct {
		ErrorMsg string `json:"error_msg"`
	}
	if json.Unmarshal(body, &e) != nil {
		return ""
	}
	return e.ErrorMsg
}

// ItemLevel: a 400 that is about an item of the body — not about the request (a missing
// digest, a body APISIX cannot read) or a version.
func ItemLevel(body []byte) bool {
	msg := ErrorMessage(body)
	switch {
	case msg == "", msg == "missing digest header", strings.HasPrefix(msg, "invalid request body"),
		strings.Contains(msg, "_conf_version must be"):
		return false
	}
	return true
}

var prefixed = regexp.MustCompile(`^invalid (\S+) at index (\d+), err: `)

// PutRejection is the item a PUT's 400 names on APISIX 3.13 and 3.14, which have no
// validate endpoint: "invalid <section> at index <i>, err: <error>". ok is false when the
// message names none.
func PutRejection(body []byte) (r rewrite.Rejection, ok bool) {
	msg := ErrorMessage(body)
	m := prefixed.FindStringSubmatch(msg)
	if m == nil {
		return rewrite.Rejection{}, false
	}
	i, err := strconv.Atoi(m[2])
	if err != nil {
		return rewrite.Rejection{}, false
	}
	return rewrite.Rejection{Section: m[1], Index: i, Error: strings.TrimPrefix(msg, m[0])}, true
}

// StateDependent: APISIX rejected an item for what the data plane holds (a plugin
// another global rule uses, 3.17; a key another consumer or credential holds, 3.18),
// not for what the item is: it passes once that is gone (spec §4.1.3).
func StateDependent(msg string) bool {
	return strings.Contains(msg, "already exists in global rule") || strings.Contains(msg, " found with consumer: ") ||
		strings.Contains(msg, " found with credential: ")
}

// dictFullMessage is APISIX's answer when the encoded document does not fit the
// standalone-config shared dict (spec §2, §11): a plain-text 500,
// "failed to save config to shared dict: no memory".
const dictFullMessage = "failed to save config to shared dict: "

// IsDictFull: APISIX validated the configuration but could not store it: it is larger
// than nginx_config.meta.lua_shared_dict.standalone-config.
func IsDictFull(a *Answer) bool {
	return a.Status == http.StatusInternalServerError && bytes.HasPrefix(a.Body, []byte(dictFullMessage)) &&
		bytes.Contains(a.Body, []byte("no memory"))
}
