%%% @doc What one chain request from outside the node may make the port
%%% do (dev_kem's `execute_chain', through `kem:request_chain_usage/2'),
%%% checked before a frame is made.
%%%
%%% - One budget per request: every buffer the chain makes (each step's new
%%%   output, a temporary until the chain ends) counts against the one
%%%   `request_max_output_bytes' (16 MiB by default), as a call's output
%%%   does. Checked per step only, 64 steps of 16 MiB each made the port
%%%   grow by 1 GB from a 3.9 KB body (issue 24).
%%% - A bounded dispatch: a step's `workgroups' may not exceed what
%%%   execute_kernel would dispatch for the same output, one workgroup per
%%%   4-byte element (docs/dispatch.md; at `@workgroup_size(1)' that is
%%%   exactly execute_kernel's count, at any larger size execute_kernel
%%%   dispatches fewer). An 87-byte body asking for 65535 x 65535 x 64
%%%   workgroups of `double' held a port until its timeout restarted it.
%%%   A step with no output of its own (it writes a named buffer) is
%%%   bounded by the largest buffer the chain holds. A step's `grid' is
%%%   invocations, and the kernel's workgroup size is not known here, so
%%%   it is bounded as if each workgroup were one invocation: X*Y*Z at
%%%   most one per 4-byte element. The port dispatches
%%%   ceil(X/wx)*ceil(Y/wy)*ceil(Z/wz) workgroups, never more than X*Y*Z
%%%   (each ceil(n/w) =< n), so this holds whatever the size: a matmul's
%%%   M x N grid for an M x N f32 output is exactly at the bound.
%%% Sizes follow the port's rules (kem_port/gpu/chain_plan.py): a step
%%% reads the previous step's output unless it names an `input'; its output
%%% is `output_size' bytes, else as large as what it reads; an `output'
%%% naming a buffer made earlier reuses that buffer. A name the port will
%%% refuse (`no_buffer') is sized as the previous output here.
-module(kem_chain_budget).

-export([check/3]).

%% @doc `ok', or the refusal naming the step: `too_large' over the budget,
%% `bad_args' for a dispatch larger than the step's output allows.
-spec check([kem_session:step()], binary(), non_neg_integer() | infinity) ->
    ok | {error, {too_large | bad_args, binary()}}.
check(Steps, Input, Budget) when is_list(Steps), is_binary(Input) ->
    try walk(Steps, 1, byte_size(Input), #{}, {0, byte_size(Input)}, Budget)
    catch throw:{refused, Reason, Detail} -> {error, {Reason, Detail}}
    end;
check(_Steps, _Input, _Budget) ->
    ok.  % the shape is kem_session's and the port's to refuse

%% Previous: the bytes of the previous step's output. Named: the sizes of
%% the buffers named so far. {Made, Largest}: the bytes made so far and the
%% largest buffer (the input included).
walk([], _N, _Previous, _Named, _Made, _Budget) ->
    ok;
walk([#{copy := _} | Rest], N, Previous, Named, Made, Budget) ->
    walk(Rest, N + 1, Previous, Named, Made, Budget);  % moves bytes between buffers; makes none
walk([#{clear := _} | Rest], N, Previous, Named, Made, Budget) ->
    walk(Rest, N + 1, Previous, Named, Made, Budget);
walk([Step | Rest], N, Previous, Named, {Made, Largest}, Budget) when is_map(Step) ->
    Source = named_size(maps:get(input, Step, none), Named, Previous),
    {Output, New0} = output(Step, Source, Named),
    %% A step's own bytes and the buffers its outputs make (by-name
    %% bindings) count too; a by-name kernel makes no binding-1 output, which
    %% kem cannot tell here, so the count errs large, never small.
    New = New0 + sizes(maps:get(outputs, Step, #{})) + bytes(maps:get(buffers, Step, #{})),
    Total = Made + New,
    Budget =:= infinity orelse Total =< Budget orelse
        refuse(too_large, N, io_lib:format("the chain's buffers need ~b bytes by this step, over this request's "
                                           "limit of ~b", [Total, Budget])),
    Bytes = max(Output, bytes_if_none(Output, Largest)),
    ok = dispatch(N, maps:get(workgroups, Step, none), Bytes),
    ok = dispatch(N, grid, maps:get(grid, Step, none), Bytes),
    Named1 = case {maps:get(output, Step, none), New > 0} of
                 {Name, true} when Name =/= none -> Named#{key(Name) => Output};
                 _ -> Named
             end,
    walk(Rest, N + 1, Output, Named1, {Total, max(Largest, Output)}, Budget);
walk([_ | Rest], N, Previous, Named, Made, Budget) ->
    walk(Rest, N + 1, Previous, Named, Made, Budget).

%% {Bytes of the step's output, bytes it newly makes}.
output(Step, Source, Named) ->
    case maps:find(key(maps:get(output, Step, none)), Named) of
        {ok, Existing} -> {Existing, 0};
        error ->
            Size = case maps:get(output_size, Step, Source) of
                       S when is_integer(S), S >= 0 -> S;
                       _ -> Source
                   end,
            {Size, Size}
    end.

sizes(Map) when is_map(Map) -> lists:sum([S || S <- maps:values(Map), is_integer(S), S >= 0]);
sizes(_) -> 0.

bytes(Map) when is_map(Map) -> lists:sum([byte_size(B) || B <- maps:values(Map), is_binary(B)]);
bytes(_) -> 0.

bytes_if_none(0, Largest) -> Largest;
bytes_if_none(_Output, _Largest) -> 0.

dispatch(N, {X, Y, Z}, Bytes) when is_integer(X), is_integer(Y), is_integer(Z) ->
    Allowed = max(1, (Bytes + 3) div 4),
    case X * Y * Z =< Allowed of
        true -> ok;
        false ->
            refuse(bad_args, N, io_lib:format("workgroups [~b, ~b, ~b] are ~b workgroups; an output of ~b bytes "
                                              "allows at most ~b (one per 4-byte element, as execute_kernel "
                                              "dispatches)", [X, Y, Z, X * Y * Z, Bytes, Allowed]))
    end;
dispatch(_N, _Workgroups, _Bytes) ->
    ok.

dispatch(N, grid, {X, Y, Z}, Bytes) when is_integer(X), is_integer(Y), is_integer(Z) ->
    Allowed = max(1, (Bytes + 3) div 4),
    case X * Y * Z =< Allowed of
        true -> ok;
        false ->
            refuse(bad_args, N, io_lib:format("grid [~b, ~b, ~b] is ~b invocations; an output of ~b bytes "
                                              "allows at most ~b (one per 4-byte element)",
                                              [X, Y, Z, X * Y * Z, Bytes, Allowed]))
    end;
dispatch(_N, grid, _Grid, _Bytes) ->
    ok.

named_size(none, _Named, Previous) -> Previous;
named_size(Name, Named, Previous) -> maps:get(key(Name), Named, Previous).

key(Name) when is_atom(Name), Name =/= none -> atom_to_binary(Name, utf8);
key(Name) -> Name.

-spec refuse(atom(), pos_integer(), iodata()) -> no_return().
refuse(Reason, N, Text) ->
    throw({refused, Reason, iolist_to_binary(["step ", integer_to_binary(N), ": ", Text])}).

%%% tests

-ifdef(TEST).
-include_lib("eunit/include/eunit.hrl").

budget_counts_every_buffer_made_test() ->
    Step = #{kernel => <<"k">>, output_size => 4096},
    ?assertEqual(ok, check(lists:duplicate(4, Step), <<0:32>>, 16384)),
    ?assertMatch({error, {too_large, <<"step 5: ", _/binary>>}}, check(lists:duplicate(5, Step), <<0:32>>, 16384)),
    %% Default sizes follow the input; a reused named buffer makes nothing new.
    ?assertMatch({error, {too_large, <<"step 3: ", _/binary>>}},
                 check(lists:duplicate(3, #{kernel => <<"k">>}), <<0:8192>>, 2048)),
    Reuse = [#{kernel => <<"k">>, output => <<"acc">>, output_size => 1024}
             | lists:duplicate(10, #{kernel => <<"k">>, output => acc})],
    ?assertEqual(ok, check(Reuse, <<>>, 1024)),
    ?assertEqual(ok, check(lists:duplicate(100, Step), <<>>, infinity)).

grid_is_bounded_by_invocations_test() ->
    %% A 48 x 64 f32 output: a grid of its shape is at the bound, one more row is over.
    ?assertEqual(ok, check([#{kernel => <<"k">>, output_size => 48 * 64 * 4, grid => {64, 48, 1}}], <<>>, 1 bsl 24)),
    ?assertMatch({error, {bad_args, <<"step 1: grid [64, 49, 1] is 3136 invocations", _/binary>>}},
                 check([#{kernel => <<"k">>, output_size => 48 * 64 * 4, grid => {64, 49, 1}}], <<>>, 1 bsl 24)),
    ?assertMatch({error, {bad_args, <<"step 1: grid [65535, 65535, 64]", _/binary>>}},
                 check([#{kernel => <<"k">>, grid => {65535, 65535, 64}}], <<0:32>>, 1 bsl 24)).

copy_and_clear_steps_make_no_bytes_test() ->
    Make = #{kernel => <<"k">>, output => <<"t">>, output_size => 4096},
    Moves = [#{copy => {<<"t">>, 0, <<"u">>, 0, 4096}}, #{clear => {<<"t">>, 0, 4096}}],
    ?assertEqual(ok, check([Make | lists:duplicate(100, hd(Moves)) ++ tl(Moves)], <<>>, 4096)),
    %% A by-name step's outputs and its own bytes count.
    ?assertMatch({error, {too_large, <<"step 2: ", _/binary>>}},
                 check([Make, #{kernel => <<"k">>, outputs => #{c => 4096}, output_size => 0}], <<>>, 6000)),
    ?assertMatch({error, {too_large, <<"step 1: ", _/binary>>}},
                 check([#{kernel => <<"k">>, buffers => #{b => <<0:65536>>}, output_size => 0}], <<>>, 4096)).

dispatch_is_bounded_by_the_output_test() ->
    ?assertMatch({error, {bad_args, <<"step 1: workgroups [65535, 65535, 64]", _/binary>>}},
                 check([#{kernel => <<"k">>, workgroups => {65535, 65535, 64}}], <<0:32>>, 1 bsl 24)),
    ?assertEqual(ok, check([#{kernel => <<"k">>, workgroups => {256, 1, 1}}], <<0:8192>>, 1 bsl 24)),
    ?assertMatch({error, {bad_args, <<"step 1: ", _/binary>>}},
                 check([#{kernel => <<"k">>, workgroups => {257, 1, 1}}], <<0:8192>>, 1 bsl 24)),
    %% No output of its own: the largest buffer held bounds it.
    Named = [#{kernel => <<"k">>, output => <<"state">>, output_size => 4096},
             #{kernel => <<"k">>, output_size => 0, workgroups => {1024, 1, 1}}],
    ?assertEqual(ok, check(Named, <<>>, 1 bsl 24)).
-endif.
