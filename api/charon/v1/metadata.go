package charonv1

// CandidateHeader, in the metadata of a charon.v1 Explain call, asks for
// the candidate's explanation instead of the live one (charon explain
// --candidate); on the debug port, /explain?candidate=1 does.
const CandidateHeader = "charon-candidate"
