%%% @doc Renders `kem_metrics:families/0' in the Prometheus text exposition
%%% format (0.0.4): `# HELP', `# TYPE', then one sample per line; histograms
%%% as cumulative `_bucket{le=...}', `_sum' and `_count'.
-module(kem_metrics_text).
-export([render/1]).

-spec render([kem_metrics:family()]) -> binary().
render(Families) ->
    iolist_to_binary([family(F) || F <- Families]).

family({Name, histogram, Help, Series}) ->
    [header(Name, histogram, Help) | [histogram(Name, S) || S <- Series]];
family({Name, Type, Help, Series}) ->
    [header(Name, Type, Help) | [sample(Name, Labels, Value) || {Labels, Value} <- Series]].

header(Name, Type, Help) ->
    ["# HELP ", Name, " ", escape_help(Help), "\n# TYPE ", Name, " ", atom_to_list(Type), "\n"].

histogram(Name, {Labels, Buckets, Count, Sum}) ->
    [[sample(<<Name/binary, "_bucket">>, Labels ++ [{<<"le">>, le(Le)}], N) || {Le, N} <- Buckets],
     sample(<<Name/binary, "_sum">>, Labels, Sum),
     sample(<<Name/binary, "_count">>, Labels, Count)].

sample(Name, [], Value) ->
    [Name, " ", number(Value), "\n"];
sample(Name, Labels, Value) ->
    Pairs = lists:join(",", [[K, "=\"", escape_label(V), "\""] || {K, V} <- Labels]),
    [Name, "{", Pairs, "} ", number(Value), "\n"].

le(inf) -> <<"+Inf">>;
le(Le) -> number(Le).

number(N) when is_integer(N) -> integer_to_binary(N);
number(F) when is_float(F) -> float_to_binary(F, [short]).

escape_label(V) ->
    binary:replace(binary:replace(binary:replace(V, <<"\\">>, <<"\\\\">>, [global]),
                                  <<"\"">>, <<"\\\"">>, [global]),
                   <<"\n">>, <<"\\n">>, [global]).

escape_help(V) ->
    binary:replace(binary:replace(V, <<"\\">>, <<"\\\\">>, [global]), <<"\n">>, <<"\\n">>, [global]).
