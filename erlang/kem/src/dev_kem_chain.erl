%%% @doc The `execute_chain' request of `dev_kem': a stateless chain of
%%% kernels in one request, run in one GPU submission (docs/sessions.md).
%%%
%%% JSON body: `{"input-data": [bytes], "steps": [Step, ...]}', each Step
%%% `{"kernel-id", "params": [u32], "output-size": N, "workgroups": [X,Y,Z],
%%% "entry-point", "input": Name, "output": Name, "bind": {WgslName: Name}}'
%%% (only `kernel-id' required; snake_case names work too). The reply is
%%% the last step's output.
%%% Sessions are not offered here: an ao process is deterministic and
%%% replayable on any node, a session lives on one node's GPU.
-module(dev_kem_chain).
-export([request/1, flat_reason/1]).

-define(MAX_STEPS, 256).

%% @doc The steps and chain options of a decoded JSON body (field names
%% kebab-case or snake_case, as dev_kem accepts them).
-spec request(map() | {bad_request, binary()}) -> {ok, [kem_session:step()], map()} | {bad_request, binary()}.
request({bad_request, Detail}) ->
    {bad_request, Detail};
request(Body) ->
    try
        Fields = snake(Body),
        Steps = steps(maps:get(<<"steps">>, Fields, missing)),
        Input = input(maps:get(<<"input_data">>, Fields, <<>>)),
        {ok, Steps, #{input => Input}}
    catch
        throw:{bad_request, Detail} -> {bad_request, Detail}
    end.

%% @doc A chain step's failure as dev_kem's `{Reason, Detail}': "step N: ...".
-spec flat_reason(term()) -> term().
flat_reason({Reason, #{step := N, detail := D}}) when is_integer(N), is_binary(D) ->
    {Reason, <<"step ", (integer_to_binary(N))/binary, ": ", D/binary>>};
flat_reason(Reason) ->
    Reason.

snake(Map) when is_map(Map) ->
    maps:from_list([{binary:replace(K, <<"-">>, <<"_">>, [global]), V} || {K, V} <- maps:to_list(Map), is_binary(K)]);
snake(Other) ->
    Other.

steps(List) when is_list(List), List =/= [], length(List) =< ?MAX_STEPS ->
    [step(N, S) || {N, S} <- lists:zip(lists:seq(1, length(List)), List)];
steps(missing) -> bad(<<"steps is required: a list of {kernel_id, ...}">>);
steps(_) -> bad(<<"steps must be a non-empty array of at most 256 objects">>).

step(N, Map) when is_map(Map) ->
    Step = maps:fold(fun(Key, Value, Acc) -> field(N, Key, Value, Acc) end, #{}, snake(Map)),
    maps:is_key(kernel, Step) orelse bad(N, <<"a step needs kernel_id">>),
    Step;
step(N, _) -> bad(N, <<"a step must be an object">>).

field(_, <<"kernel_id">>, Id, Acc) when is_binary(Id), Id =/= <<>> -> Acc#{kernel => Id};
field(_, <<"params">>, Words, Acc) when is_list(Words), Words =/= [] ->
    case lists:all(fun(X) -> is_integer(X) andalso X >= 0 andalso X =< 16#FFFFFFFF end, Words) of
        true -> Acc#{params => << <<X:32/little>> || X <- Words >>};
        false -> throw({bad_request, <<"params must be integers 0..4294967295">>})
    end;
field(_, <<"output_size">>, Size, Acc) when is_integer(Size), Size >= 0 -> Acc#{output_size => Size};
field(_, <<"workgroups">>, [X, Y, Z], Acc) when is_integer(X), is_integer(Y), is_integer(Z),
                                                 X > 0, Y > 0, Z > 0 -> Acc#{workgroups => {X, Y, Z}};
field(_, <<"entry_point">>, E, Acc) when is_binary(E) -> Acc#{entry_point => E};
field(_, <<"input">>, Name, Acc) when is_binary(Name) -> Acc#{input => Name};
field(_, <<"output">>, Name, Acc) when is_binary(Name) -> Acc#{output => Name};
field(_, <<"bind">>, Bind, Acc) when is_map(Bind) -> Acc#{bind => Bind};
field(N, Key, _, _) when is_binary(Key) ->
    bad(N, <<"bad or unknown field ", Key/binary>>).

input(List) when is_list(List) ->
    case lists:all(fun(B) -> is_integer(B) andalso B >= 0 andalso B =< 255 end, List) of
        true -> list_to_binary(List);
        false -> bad(<<"input_data must be an array of integers 0-255">>)
    end;
input(Bin) when is_binary(Bin) -> Bin;
input(_) -> bad(<<"input_data must be an array of integers 0-255">>).

-spec bad(binary()) -> no_return().
bad(Detail) -> throw({bad_request, Detail}).

-spec bad(pos_integer(), binary()) -> no_return().
bad(N, Detail) -> throw({bad_request, <<"step ", (integer_to_binary(N))/binary, ": ", Detail/binary>>}).
