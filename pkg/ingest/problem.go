package ingest

import "github.com/penguinhq/dispatcher/pkg/httpapi"

type problem = httpapi.Problem

var (
	writeProblem = httpapi.WriteProblem
	writeJSON    = httpapi.WriteJSON
)
