%%% @doc What one chain request from outside the node may make the port
%%% do (dev_kem's `execute_chain', through `kem:request_chain_usage/2'),
%%% checked before a frame is made.
%%%
%%% - One budget per request: every buffer the chain makes (each step's new
%%%   output, what its `outputs' make, its own `buffers', a temporary until
%%%   the chain ends) counts against the one `request_max_output_bytes'
%%%   (16 MiB by default), as a call's output does. Checked per step only,
%%%   64 steps of 16 MiB each made the port grow by 1 GB from a 3.9 KB body
%%%   (issue 24). Each is counted as the port allocates it
%%%   (gpu/session/chain_plan.py, chain_bind.py): whole 4-byte words, at
%%%   least one word.
%%% - The rule for binding 1 (issue 25). The port makes a binding-1 output
%%%   only for a kem@1.0-shaped kernel (chain_plan.py: `layout.positional');
%%%   a kernel that binds every buffer by name makes none, and refuses
%%%   `params', `input', `output' and `output_size'. Which shape a kernel
%%%   has only its source tells, which kem does not read here; and a
%%%   kem@1.0-shaped kernel with named bindings at 3 and up (life.wgsl)
%%%   given `outputs' and no `output_size' still makes a binding-1 output
%%%   the size of its input (seen through the real port:
%%%   dev_kem_chain_tests, a kem@1.0-shaped step with `outputs'). So every
%%%   kernel step counts the binding-1 output the port would make were the
%%%   kernel kem@1.0-shaped: `output_size', else the size of what it reads
%%%   (the named `input', else the previous step's output, else the chain's
%%%   input). For by-name steps that follow no kem@1.0-shaped step and no
%%%   input-data that size is 0, and a step that looks by name (it gives
%%%   `bind', `buffers' or `outputs' and none of the four) counts 0 for it:
%%%   the count is then exact. Were such a kernel kem@1.0-shaped after
%%%   all, the port makes a 4-byte scratch word: at most 4 bytes a step
%%%   over this count (1 KiB in 256 steps). A by-name step after a
%%%   kem@1.0-shaped step of S bytes counts S it may not make: the count
%%%   errs large there, never small.
%%% - A bounded dispatch: a step's `workgroups' may not exceed what
%%%   execute_kernel would dispatch for the same output, one workgroup per
%%%   4-byte element (docs/dispatch.md; at `@workgroup_size(1)' that is
%%%   exactly execute_kernel's count, at any larger size execute_kernel
%%%   dispatches fewer). An 87-byte body asking for 65535 x 65535 x 64
%%%   workgroups of `double' held a port until its timeout restarted it.
%%%   A step's own bytes are its output, its `outputs' and its `buffers'
%%%   together (as dev_kem_opts:bound/3 bounds a single call); a step with
%%%   no output of its own, or one that binds by name (`bind', `buffers',
%%%   `outputs': it may bind any buffer the chain holds), is bounded by the
%%%   largest buffer the chain holds when that is more. A step's `grid' is
%%%   invocations, and the kernel's workgroup size is not known here, so
%%%   it is bounded as if each workgroup were one invocation: X*Y*Z at
%%%   most one per 4-byte element. The port dispatches
%%%   ceil(X/wx)*ceil(Y/wy)*ceil(Z/wz) workgroups, never more than X*Y*Z
%%%   (each ceil(n/w) =< n), so this holds whatever the size: a matmul's
%%%   M x N grid for an M x N f32 output is exactly at the bound.
%%% Sizes follow the port's rules (kem_port/gpu/session/chain_plan.py): a
%%% step reads the previous step's output unless it names an `input'; its
%%% output is `output_size' bytes, else as large as what it reads; an
%%% `output' naming a buffer made earlier reuses that buffer; a buffer
%%% `outputs' made is sized by it wherever a later step names it. A name
%%% the port will refuse (`no_buffer') is sized as the previous output here.
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
    {Output, Fresh} = output(Step, Source, Named),
    Outputs = sizes(maps:get(outputs, Step, #{})),
    Own = bytes(maps:get(buffers, Step, #{})),
    %% What the port allocates (chain_plan.py, chain_bind.py): each new
    %% buffer whole words, at least one; binding 1 counted whether or not
    %% the kernel has one (see the module doc).
    New = case Fresh of true -> first_word(Step, Output); false -> 0 end
          + lists:sum([word(S) || {_, S} <- Outputs]) + lists:sum([word(B) || B <- Own]),
    Total = Made + New,
    Budget =:= infinity orelse Total =< Budget orelse
        refuse(too_large, N, io_lib:format("the chain's buffers need ~b bytes by this step, over this request's "
                                           "limit of ~b", [Total, Budget])),
    Bytes = bound_bytes(Step, Output + lists:sum([S || {_, S} <- Outputs]) + lists:sum(Own), Largest),
    ok = dispatch(N, maps:get(workgroups, Step, none), Bytes),
    ok = dispatch(N, grid, maps:get(grid, Step, none), Bytes),
    Made1 = maps:from_list([{key(Name), S} || {Name, S} <- Outputs]),
    Named1 = case {maps:get(output, Step, none), Fresh} of
                 {Name, true} when Name =/= none -> Made1#{key(Name) => Output};
                 _ -> Made1
             end,
    Held = lists:max([Largest, Output | maps:values(Made1)]),
    walk(Rest, N + 1, Output, maps:merge(Named, Named1), {Total, Held}, Budget);
walk([_ | Rest], N, Previous, Named, Made, Budget) ->
    walk(Rest, N + 1, Previous, Named, Made, Budget).

%% {Bytes of the step's output, whether it makes it new}.
output(Step, Source, Named) ->
    case maps:find(key(maps:get(output, Step, none)), Named) of
        {ok, Existing} -> {Existing, false};
        error ->
            Size = case maps:get(output_size, Step, Source) of
                       S when is_integer(S), S >= 0 -> S;
                       _ -> Source
                   end,
            {Size, true}
    end.

%% A buffer as the port allocates it: whole 4-byte words, at least one.
word(Size) -> max((Size + 3) div 4 * 4, 4).

%% A new binding-1 output: a by-name-looking step's default of 0 bytes
%% counts 0 (a by-name kernel makes none; module doc).
first_word(Step, 0) ->
    case looks_by_name(Step) of
        true -> 0;
        false -> word(0)
    end;
first_word(_Step, Output) -> word(Output).

looks_by_name(Step) ->
    lists:any(fun(K) -> maps:is_key(K, Step) end, [bind, buffers, outputs])
        andalso not lists:any(fun(K) -> maps:is_key(K, Step) end, [params, input, output, output_size]).

%% The bytes that bound a step's dispatch: its own (binding 1, what its
%% `outputs' make, its `buffers'); for a step that binds by name, or has
%% no output of its own, at least the largest buffer the chain holds (it
%% may bind any of them).
bound_bytes(Step, StepBytes, Largest) ->
    ByName = lists:any(fun(K) -> maps:is_key(K, Step) end, [bind, buffers, outputs]),
    case ByName orelse maps:get(output_size, Step, none) =:= 0 orelse StepBytes =:= 0 of
        true -> max(StepBytes, Largest);
        false -> StepBytes
    end.

sizes(Map) when is_map(Map) -> [{K, S} || {K, S} <- maps:to_list(Map), is_integer(S), S >= 0];
sizes(_) -> [].

bytes(Map) when is_map(Map) -> [byte_size(B) || B <- maps:values(Map), is_binary(B)];
bytes(_) -> [].

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

%% Issue 25: a by-name chain (c = a + b, then d from c in place of the
%% default binding 1) counted to the word, admitted at exactly the budget
%% (before: every grid over 1 invocation was refused, bad_args, as if it
%% had no bytes) and refused a word over.
by_name_chain_fits_exactly_test() ->
    Add = fun(DSize) ->
                  [#{kernel => <<"add">>, buffers => #{a => <<0:32768>>, b => <<0:32768>>}, outputs => #{c => 4096},
                     grid => {1024, 1, 1}},
                   #{kernel => <<"scale">>, bind => #{x => c}, outputs => #{d => DSize}, constants => #{k => 2},
                     grid => {1024, 1, 1}}]
          end,
    ?assertEqual(ok, check(Add(4096), <<>>, 16384)),
    ?assertMatch({error, {too_large, <<"step 2: the chain's buffers need 16388 bytes", _/binary>>}},
                 check(Add(4097), <<>>, 16384)),
    ?assertMatch({error, {too_large, <<"step 2: ", _/binary>>}}, check(Add(4096), <<>>, 16383)),
    %% The grid bound counts the step's buffers: one per 4-byte element.
    ?assertMatch({error, {bad_args, <<"step 1: grid [3073, 1, 1]", _/binary>>}},
                 check([(hd(Add(4096)))#{grid => {3073, 1, 1}}], <<>>, 1 bsl 24)).

%% A buffer `outputs' made is sized by it when a later step reads it as
%% its `input' (before: the previous output's size, 0 here, so 8 KiB went
%% uncounted); a by-name step after a kem@1.0-shaped one counts that
%% step's size once more (the rule that errs large, module doc).
outputs_are_sized_where_named_test() ->
    Steps = [#{kernel => <<"fill">>, outputs => #{c => 8192}},
             #{kernel => <<"double">>, input => c}],
    ?assertEqual(ok, check(Steps, <<>>, 16384)),
    ?assertMatch({error, {too_large, <<"step 2: ", _/binary>>}}, check(Steps, <<>>, 16383)),
    Mixed = [#{kernel => <<"double">>, output => x},
             #{kernel => <<"scale">>, bind => #{x => x}, outputs => #{d => 4096}, grid => {1024, 1, 1}}],
    ?assertEqual(ok, check(Mixed, <<0:32768>>, 3 * 4096)),
    ?assertMatch({error, {too_large, <<"step 2: ", _/binary>>}}, check(Mixed, <<0:32768>>, 3 * 4096 - 1)).

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
