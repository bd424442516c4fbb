%%% @doc The `execute_chain' request of `dev_kem': a stateless chain of
%%% kernels in one request, run in one GPU submission (docs/sessions.md).
%%%
%%% JSON body: `{"input-data": [bytes], "steps": [Step, ...]}', each Step
%%% `{"kernel-id", "params": [u32], "output-size": N, "workgroups": [X,Y,Z]
%%% or "grid": [X,Y,Z], "entry-point", "input": Name, "output": Name,
%%% "bind": {WgslName: Name}, "buffers": {WgslName: [bytes]}, "outputs":
%%% {Name: Size}, "constants": {Name: Number}}' (only `kernel-id' required;
%%% snake_case names work too), or a copy or clear of buffers earlier steps
%%% made, `{"copy": [Src, SrcOffset, Dst, DstOffset, Size]}' or `{"clear":
%%% [Buffer, Offset, Size]}'. A message's map body (a Lua table, an ao
%%% message) has the same fields, its `buffers' values bytes as `run' takes
%%% them (dev_kem_run: a binary, or a message whose `body' is one; never
%%% numbers) and `input-data' a binary. A step's `buffers', `outputs' and
%%% `constants' are read by the very functions `run' reads its own with
%%% (dev_kem_run:named/3, dev_kem_opts:dispatch/3), so a user learns one
%%% way; in JSON, which has no bytes, a buffer is an array of integers
%%% 0-255, as `input-data' is (a string is text, refused, as for
%%% `input-data'). Every bad field is a 4xx whose detail begins "step N: "
%%% and names the field.
%%%
%%% The reply is the last step's output: its bytes as the body when it is
%%% a kem@1.0-shaped kernel's binding 1; when the last kernel step binds by
%%% name (kem:chain/2's `{ok, #{Name => Bytes}}'), `run''s reply, `buffers'
%%% with each name's `#{<<"body">> => Bytes}' (dev_kem_run:named_reply/4).
%%% `"gas-limit": N' (an integer 1..2^63-1, or its digits in a message
%%% body) is the whole chain's gas budget (docs/metering.md): a looping
%%% step that runs out answers 402 `gas_exhausted', "step N: ...".
%%% Sessions are not offered here: an ao process is deterministic and
%%% replayable on any node, a session lives on one node's GPU.
-module(dev_kem_chain).
-export([request/1, request/2, reply/4, flat_reason/1]).

-define(MAX_STEPS, 256).
%% dev_kem_run's (the port's MAX_STEP_BUFFERS): a JSON map of more is not read.
-define(MAX_STEP_BUFFERS, 64).
-define(NAMED, [<<"buffers">>, <<"outputs">>, <<"constants">>, <<"grid">>, <<"workgroups">>]).

%% @doc The steps and chain options of a decoded JSON body (`{json,
%% Map}') or a message's map body (field names kebab-case or snake_case, as
%% dev_kem accepts them; one field under both names is refused, as a JSON
%% key given twice is). Sizes and dispatches are checked on the request
%% road, kem:request_chain_usage/2 (kem_chain_budget).
-spec request({json, map()} | map() | {bad_request, atom(), binary()}) ->
    {ok, [kem_session:step()], map()} | {bad_request, atom(), binary()}.
request(Body) ->
    request(Body, #{}).

%% @doc As request/1, with the node's Opts to read a message's nested
%% values (dev_kem:field/3).
-spec request({json, map()} | map() | {bad_request, atom(), binary()}, map()) ->
    {ok, [kem_session:step()], map()} | {bad_request, atom(), binary()}.
request({bad_request, Reason, Detail}, _Opts) ->
    {bad_request, Reason, Detail};
request({json, Body}, Opts) ->
    fields(Body, {json, Opts});
request(Body, Opts) ->
    fields(Body, {message, Opts}).

%% @doc The 200 of a chain that ran: the bytes of a kem@1.0-shaped last
%% step, or `run''s reply of named results; the usage's `bytes_in' counts
%% the steps' own buffers too, as `run''s counts its buffers.
-spec reply(binary() | #{binary() => binary()}, kem:usage(), [kem_session:step()], map()) ->
    {ok, map()} | {error, map()}.
reply(Result, Usage, Steps, Opts) ->
    Given = lists:sum([byte_size(B) || #{buffers := Bs} <- Steps, B <- maps:values(Bs), is_binary(B)]),
    Counted = Usage#{bytes_in => maps:get(bytes_in, Usage, 0) + Given},
    case is_map(Result) of
        true -> dev_kem_run:named_reply(Result, Counted, Opts, <<"Failed to execute chain">>);
        false -> kem_reply:success(Result, Counted, Opts)
    end.

fields(Body, {Origin, _} = Ctx) ->
    try
        Fields = snake(0, Body),
        Steps = steps(maps:get(<<"steps">>, Fields, missing), Ctx),
        Input = input(maps:get(<<"input_data">>, Fields, []), Origin),  % none: a chain of by-name steps
        {ok, Steps, gas_limit(maps:get(<<"gas_limit">>, Fields, none), #{input => Input})}
    catch
        throw:{bad_request, Reason, Detail} -> {bad_request, Reason, Detail}
    end.

%% @doc A chain step's failure as dev_kem's `{Reason, Detail}': "step N: ...".
-spec flat_reason(term()) -> term().
flat_reason({Reason, #{step := N, detail := D}}) when is_integer(N), is_binary(D) ->
    {Reason, <<"step ", (integer_to_binary(N))/binary, ": ", D/binary>>};
flat_reason(Reason) ->
    Reason.

%% N: the step the map is (0: the body).
snake(N, Map) when is_map(Map) ->
    Pairs = [{binary:replace(K, <<"-">>, <<"_">>, [global]), K, V} || {K, V} <- maps:to_list(Map), is_binary(K)],
    Snake = maps:from_list([{S, V} || {S, _, V} <- Pairs]),
    case map_size(Snake) =:= length(Pairs) of
        true -> Snake;
        false -> bad(N, bad_args, dev_kem:duplicate_key(twice(Pairs, #{})))
    end;
snake(_N, Other) ->
    Other.

%% The first key whose snake_case name came before, in one pass: a count
%% per key was quadratic (16,000 keys, a 165 KB body: 2.4 s of the node's
%% CPU per request).
twice([{S, K, _} | Rest], Seen) ->
    case maps:is_key(S, Seen) of
        true -> K;
        false -> twice(Rest, Seen#{S => true})
    end.

steps(List, Ctx) when is_list(List), List =/= [], length(List) =< ?MAX_STEPS ->
    [step(N, S, Ctx) || {N, S} <- lists:zip(lists:seq(1, length(List)), List)];
steps(missing, _Ctx) -> bad(<<"steps is required: a list of {kernel_id, ...}">>);
steps(_, _Ctx) -> bad(<<"steps must be a non-empty array of at most 256 objects">>).

step(N, Map, Ctx) when is_map(Map) ->
    Fields = snake(N, Map),
    Named = maps:fold(fun(Key, Value, Acc) -> named(N, Key, Value, Ctx, Acc) end, #{},
                      maps:with(?NAMED, Fields)),
    maps:is_key(grid, Named) andalso maps:is_key(workgroups, Named)
        andalso bad(N, <<"give grid or workgroups, not both">>),
    Step = maps:fold(fun(Key, Value, Acc) -> field(N, Key, Value, Acc) end, Named, maps:without(?NAMED, Fields)),
    Moves = maps:with([copy, clear], Step),
    case map_size(Moves) of
        0 -> maps:is_key(kernel, Step) orelse bad(N, <<"a step needs kernel_id (or is a copy or a clear)">>);
        _ -> map_size(Step) =:= 1 orelse bad(N, <<"a copy or clear step has that one field alone">>)
    end,
    Step;
step(N, _, _Ctx) -> bad(N, <<"a step must be an object">>).

%% The general binding model's fields (issue 25), read as `run' reads its
%% own: `buffers' and `outputs' by dev_kem_run:named/3, `constants' by
%% dev_kem_opts:dispatch/3 (names WGSL identifiers, numbers typed or as
%% decimal text, no NaN or infinity, at most 64 of each), `grid' and
%% `workgroups' by dev_kem_opts:triple/3 (`[X, Y, Z]', `"X,Y,Z"', a
%% message `{1: X, 2: Y, 3: Z}'; each 1..2^32-1).
named(N, <<"buffers">>, Value, {Origin, Opts}, Acc) ->
    Acc#{buffers => given(N, dev_kem_run:named(buffers, json_bytes(N, Value, Origin), Opts))};
named(N, <<"outputs">>, Value, {_Origin, Opts}, Acc) ->
    Acc#{outputs => given(N, dev_kem_run:named(outputs, Value, Opts))};
named(N, Key, Value, {_Origin, Opts}, Acc) when Key =:= <<"grid">>; Key =:= <<"workgroups">> ->
    Atom = binary_to_existing_atom(Key, utf8),
    case dev_kem_opts:triple(Atom, Value, Opts) of
        {ok, Triple} -> Acc#{Atom => Triple};
        {error, Detail} -> bad(N, bad_args, Detail)
    end;
named(N, <<"constants">>, Value, {_Origin, Opts}, Acc) ->
    case dev_kem_opts:dispatch(#{constants => Value}, Opts, #{}) of
        {ok, #{constants := Constants}} -> Acc#{constants => Constants};
        {error, Detail} -> bad(N, bad_args, Detail)
    end.

given(_N, {ok, Map}) -> Map;
given(N, {error, {413, Reason, Detail}}) -> bad(N, Reason, Detail);
given(N, {error, {_Status, _Reason, Detail}}) -> bad(N, bad_args, Detail).

%% JSON has no bytes: a buffer is an array of integers 0-255 there, as
%% input-data is, turned into the binary `run' takes (one bind group's
%% object, `{"1": {"2": [..]}}', likewise). At most 64 values are read:
%% dev_kem_run refuses a larger map by its size before reading a value.
json_bytes(N, Map, json) when is_map(Map), map_size(Map) =< ?MAX_STEP_BUFFERS ->
    maps:map(fun(Name, V) -> json_value(N, Name, V, group) end, Map);
json_bytes(_N, Value, _Origin) ->
    Value.

json_value(N, Name, List, _) when is_list(List) ->
    case lists:all(fun(B) -> is_integer(B) andalso B >= 0 andalso B =< 255 end, List) of
        true -> list_to_binary(List);
        false -> bad(N, bad_args, <<"buffer '", (shown(Name))/binary, "' must be an array of integers 0-255">>)
    end;
json_value(N, Name, Text, _) when is_binary(Text) ->
    bad(N, bad_args, <<"buffer '", (shown(Name))/binary, "' in a JSON body must be an array of integers 0-255, "
                       "not a string (a string is text); to send raw bytes, send the chain as a message whose "
                       "buffers are binaries">>);
json_value(N, _Name, Group, group) when is_map(Group), map_size(Group) =< ?MAX_STEP_BUFFERS ->
    maps:map(fun(Name, V) -> json_value(N, Name, V, leaf) end, Group);
json_value(_N, _Name, Other, _) ->
    Other.  % dev_kem_run refuses it, naming the buffer

shown(Name) when is_binary(Name), byte_size(Name) > 64 -> binary:part(Name, 0, 64);
shown(Name) when is_binary(Name) -> Name;
shown(_) -> <<"?">>.

field(_, <<"kernel_id">>, Id, Acc) when is_binary(Id), Id =/= <<>> -> Acc#{kernel => Id};
field(_, <<"params">>, Words, Acc) when is_list(Words), Words =/= [] ->
    case lists:all(fun(X) -> is_integer(X) andalso X >= 0 andalso X =< 16#FFFFFFFF end, Words) of
        true -> Acc#{params => << <<X:32/little>> || X <- Words >>};
        false -> bad(<<"params must be integers 0..4294967295">>)
    end;
field(_, <<"output_size">>, Size, Acc) when is_integer(Size), Size >= 0 -> Acc#{output_size => Size};
field(_, <<"entry_point">>, E, Acc) when is_binary(E) -> Acc#{entry_point => E};
field(_, <<"input">>, Name, Acc) when is_binary(Name) -> Acc#{input => Name};
field(_, <<"output">>, Name, Acc) when is_binary(Name) -> Acc#{output => Name};
field(_, <<"bind">>, Bind, Acc) when is_map(Bind) -> Acc#{bind => Bind};
%% A copy or clear step (docs/sessions.md), its tuple as a JSON array:
%% "copy": [Src, SrcOffset, Dst, DstOffset, Size], "clear": [Buffer, Offset, Size].
field(_, <<"copy">>, [Src, SrcOffset, Dst, DstOffset, Size], Acc)
  when is_binary(Src), is_binary(Dst), is_integer(SrcOffset), is_integer(DstOffset), is_integer(Size) ->
    Acc#{copy => {Src, SrcOffset, Dst, DstOffset, Size}};
field(_, <<"clear">>, [Buffer, Offset, Size], Acc) when is_binary(Buffer), is_integer(Offset), is_integer(Size) ->
    Acc#{clear => {Buffer, Offset, Size}};
field(N, Key, _, _) when is_binary(Key) ->
    bad(N, <<"bad or unknown field ", Key/binary>>).

gas_limit(none, Opts) -> Opts;
gas_limit(N, Opts) when is_integer(N), N >= 1, N < 1 bsl 63 -> Opts#{gas_limit => N};
gas_limit(Digits, Opts) when is_binary(Digits), byte_size(Digits) =< 19 ->
    case re:run(Digits, <<"^[0-9]+$">>, [dollar_endonly]) of  % $ alone took "100\n": binary_to_integer raised
        {match, _} -> gas_limit(binary_to_integer(Digits), Opts);
        nomatch -> gas_limit(bad, Opts)
    end;
gas_limit(_, _) -> bad(0, bad_args, <<"gas-limit must be an integer 1..2^63-1 (docs/metering.md)">>).

input(List, _Origin) when is_list(List) ->
    case lists:all(fun(B) -> is_integer(B) andalso B >= 0 andalso B =< 255 end, List) of
        true -> list_to_binary(List);
        false -> bad(<<"input_data must be an array of integers 0-255">>)
    end;
input(Text, json) when is_binary(Text) -> bad(0, bad_args, dev_kem:string_input());
input(Bin, message) when is_binary(Bin) -> Bin;  % a message's value: raw bytes
input(_, _Origin) -> bad(<<"input_data must be an array of integers 0-255">>).

-spec bad(binary()) -> no_return().
bad(Detail) -> bad(0, bad_request, Detail).

-spec bad(non_neg_integer(), binary()) -> no_return().
bad(N, Detail) -> bad(N, bad_request, Detail).

%% N: the step at fault, 0 for the body.
-spec bad(non_neg_integer(), atom(), binary()) -> no_return().
bad(0, Reason, Detail) -> throw({bad_request, Reason, Detail});
bad(N, Reason, Detail) -> throw({bad_request, Reason, <<"step ", (integer_to_binary(N))/binary, ": ", Detail/binary>>}).
