package runs

// Spend is tokens spent and what they cost in one currency, at the prices
// the operator set (the money_line view). Costs are decimal strings, exact
// as PostgreSQL's numeric: a float would round them.
type Spend struct {
	Currency        string // "" for unpriced spend alone
	Cost            string
	ReportedCost    string // of the spend the provider reported
	WorstCaseCost   string // of spend posted at its worst case (expired leases)
	PricedTokens    int64
	WorstCaseTokens int64
	UnpricedTokens  int64 // spend of models with no price: in no cost
}

// DaySpend is a tenant's spend on one UTC day in one currency.
type DaySpend struct {
	Day  string // YYYY-MM-DD
	Runs int64  // runs with spend that day
	Spend
}

// RunSpend is one run's spend in one currency.
type RunSpend struct {
	RunID string
	Spend
}

// SpendReport is a tenant's spend over a range of UTC days, and the spend
// of the runs asked for.
type SpendReport struct {
	FromDay, ToDay string // the range, inclusive, as resolved
	Days           []DaySpend
	Runs           []RunSpend
}

// SpendRangeError is a spend report's range or runs refused: Field names
// the request field, Why the limit.
type SpendRangeError struct {
	Field, Why string
}

func (e *SpendRangeError) Error() string { return e.Field + ": " + e.Why }
