%%% @doc The Erlang API never raises and no caller can crash a port owner:
%%% random terms (PropEr is not available: generated here) through
%%% `kem:execute/3', `kem:call/3', `kem:request/2' and straight to
%%% `kem_port:call/4'; every option checked; the per-request output budget.
-module(kem_args_tests).
-include_lib("eunit/include/eunit.hrl").

-define(DOUBLE, <<"double">>).

%%% without the app: every check is in Erlang, nothing reaches a port

offline_test_() ->
    [{timeout, 60, fun random_terms_never_raise_offline/0},
     fun bad_timeouts_are_refused/0,
     fun unknown_and_internal_options_are_refused/0,
     fun huge_numbers_are_refused_before_a_port/0].

random_terms_never_raise_offline() ->
    rand:seed(exsss, {1, 2, erlang:unique_integer([positive])}),
    [check_never_raises(fun(Call) -> Call end) || _ <- lists:seq(1, 5000)].

bad_timeouts_are_refused() ->
    [?assertMatch({error, {bad_args, _}}, kem:execute(?DOUBLE, <<1>>, #{timeout => T}))
     || T <- [-1, 0, 1.5, 30000.0, foo, <<"100">>, [], 1 bsl 40, 3600001, {1}]],
    [?assertMatch({error, {bad_args, _}}, kem:call(ping, {}, T)) || T <- [-1, 0, 0.5, bar]],
    %% Valid ones pass the checks and fail only because no port runs.
    [?assertMatch({error, {R, _}} when R =:= not_started; R =:= port_unavailable,
                  kem:execute(?DOUBLE, <<1>>, #{timeout => T}))
     || T <- [1, 30000, 3600000, infinity]].

unknown_and_internal_options_are_refused() ->
    Bad = [#{nonsense => 1}, #{<<"timeout">> => 5}, #{output_shm => <<"/dev/shm/x">>},
           #{output_size => 4, output_size_hint => 1}, #{output_size_hint => 0},
           #{output_size => -1}, #{params => [1, 2]}, #{workgroups => {1, 1}},
           #{workgroups => {0, 1, 1}}, #{workgroups => {1, 1, 1 bsl 33}},
           #{entry_point => 42}, #{entry_point => binary:copy(<<"a">>, 129)},
           #{max_output_bytes => -1}, #{max_output_bytes => 1.0}],
    [?assertMatch({error, {bad_args, _}}, kem:execute(?DOUBLE, <<1>>, O)) || O <- Bad],
    %% The port's shared-memory arguments are not reachable through call/3.
    ?assertMatch({error, {bad_args, _}}, kem:call(execute, {?DOUBLE, {shm, <<"/dev/shm/x">>}, #{}}, 1000)),
    ?assertMatch({error, {bad_args, _}}, kem:call(execute_kernel, {?DOUBLE, <<1>>, 0}, 1000)),
    ?assertMatch({error, {bad_args, _}}, kem:call("execute", {}, 1000)),
    ?assertMatch({error, {bad_args, _}}, kem:request(stats, {})).

huge_numbers_are_refused_before_a_port() ->
    Huge = binary_to_integer(binary:copy(<<"9">>, 100000)),
    ?assertMatch({error, {too_large, _}}, kem:execute(?DOUBLE, <<1>>, #{output_size_hint => Huge})),
    ?assertMatch({error, {too_large, _}}, kem:execute(?DOUBLE, <<1>>, #{output_size => Huge})),
    ?assertMatch({error, {too_large, _}}, kem:call(execute_kernel, {?DOUBLE, <<1>>, Huge}, 1000)),
    ?assertMatch({error, {bad_args, _}}, kem:execute(?DOUBLE, <<1>>, #{timeout => Huge})).

%%% with the app: the real port

online_test_() ->
    {setup, fun start/0, fun stop/1,
     [{timeout, 60, fun bad_terms_cannot_crash_the_port_owner/0},
      {timeout, 120, fun random_terms_never_raise_online/0},
      {timeout, 60, fun request_output_budget/0},
      {timeout, 60, fun an_input_over_the_port_limit_is_refused_in_erlang/0},
      {timeout, 60, fun session_bytes_over_the_port_limit_are_refused_in_erlang/0},
      {timeout, 60, fun a_quarantined_kernel_is_refused_in_sessions_and_chains/0},
      {timeout, 60, fun a_chain_request_keeps_the_output_budget/0},
      {timeout, 60, fun session_calls_and_chains_are_counted_and_metered/0},
      {timeout, 60, fun a_session_call_that_times_out_quarantines_its_kernel/0}]}.

start() ->
    kem_test_app:start_with_kernels("kem_args", [{"runaway", kem_test_app:runaway_kernel()}],
                                    [{request_max_output_bytes, 1000}, {max_input_bytes, 8192}]).

stop(Started) -> kem_test_app:stop_with_kernels(Started).

bad_terms_cannot_crash_the_port_owner() ->
    [Port] = kem_sup:port_names(),
    Owner = whereis(Port),
    OsPid = kem_port:os_pid(Port),
    Bad = [{Port, execute, {?DOUBLE, <<1>>, #{}}, T} || T <- [-1, 0, 1.5, foo, 1 bsl 40, <<>>]]
        ++ [{Port, M, A, 1000} || {M, A} <- [{"execute", {}}, {execute, [x]}, {42, {}}, {execute, {self(), make_ref(), fun() -> ok end}}]]
        ++ [{42, ping, {}, 1000}, {"kem_port_1", ping, {}, 1000}],
    [?assertMatch({error, {_, _}}, kem_port:call(S, M, A, T)) || {S, M, A, T} <- Bad],
    %% Whatever reaches the owner's mailbox directly.
    ?assertMatch({error, {bad_args, _}}, gen_server:call(Port, {call, execute, {}, -5})),
    ?assertMatch({error, {bad_args, _}}, gen_server:call(Port, nonsense)),
    gen_server:cast(Port, nonsense),
    Port ! {call, ping},
    ?assertEqual(Owner, whereis(Port)),
    ?assertEqual(OsPid, kem_port:os_pid(Port)),
    ?assertEqual({ok, <<2, 6, 10, 14>>}, kem:execute(?DOUBLE, <<1, 3, 5, 7>>, #{})).

random_terms_never_raise_online() ->
    Results = [check_never_raises(fun no_short_timeouts/1) || _ <- lists:seq(1, 1000)],
    Reasons = lists:foldl(fun(R, Acc) -> maps:update_with(R, fun(N) -> N + 1 end, 1, Acc) end, #{},
                          [case R of {ok, _} -> ok; {error, {Why, _}} -> Why; {{ok, _}, _} -> ok; {{error, {Why, _}}, _} -> Why end
                           || R <- Results]),
    io:format(user, "~nrandom terms through the real port: ~p~n", [Reasons]),
    %% Some reached the port and were answered by it.
    ?assert(maps:size(maps:without([bad_args, too_large], Reasons)) > 0),
    ?assertEqual(ok, kem_test_app:wait_for_service(10000)),
    Input = crypto:strong_rand_bytes(4099),
    ?assertEqual({ok, kem_ref:double_ref(Input, byte_size(Input) * 2)},
                 kem:execute(?DOUBLE, Input, #{output_size_hint => 2})).

request_output_budget() ->
    Input = crypto:strong_rand_bytes(250),
    %% 250 x 4 = 1000 bytes: at the limit; 250 x 5 over it, refused at once.
    ?assertEqual({ok, kem_ref:double_ref(Input, 1000)}, kem:request(execute_kernel, {?DOUBLE, Input, 4})),
    ?assertMatch({error, {too_large, _}}, kem:request(execute_kernel, {?DOUBLE, Input, 5})),
    ?assertMatch({error, {too_large, _}}, kem:request(execute_kernel, {?DOUBLE, <<1, 2, 3>>, 1 bsl 30})),
    Image = binary:copy(<<1, 2, 3, 4>>, 1001 div 4 + 1),
    ?assertMatch({error, {too_large, _}},
                 kem:request(execute_kernel_with_params, {<<"pixelize">>, Image, <<1:32/little, 1:32/little, 1:32/little, 0:32>>})),
    %% kem:execute takes the same budget as an option.
    ?assertMatch({error, {too_large, _}}, kem:execute(?DOUBLE, Input, #{output_size => 101, max_output_bytes => 100})),
    ?assertEqual({ok, kem_ref:double_ref(Input, 100)}, kem:execute(?DOUBLE, Input, #{output_size => 100, max_output_bytes => 100})),
    %% dev_kem applies it to every request from outside the node.
    Body = kem_json:encode(#{<<"kernel_id">> => ?DOUBLE, <<"input_data">> => binary_to_list(Input),
                             <<"output_size_hint">> => 5}),
    ?assertMatch({error, #{<<"status">> := 413}}, dev_kem:execute_kernel(#{}, #{<<"body">> => Body}, #{})).

%% Through the pipe (as when /dev/shm is full) an input over the port's
%% limit made a frame the port could answer to no caller: the caller waited
%% out its timeout and the port was restarted. Now: too_large at once.
an_input_over_the_port_limit_is_refused_in_erlang() ->
    [Port] = kem_sup:port_names(),
    OsPid = kem_port:os_pid(Port),
    Threshold = application:get_env(kem, shm_threshold, 1 bsl 20),
    ok = application:set_env(kem, shm_threshold, infinity),
    try
        %% Over the port's whole frame limit (input + params + 64 KiB).
        Input = crypto:strong_rand_bytes(300000),
        {Us, Result} = timer:tc(kem, execute, [?DOUBLE, Input, #{timeout => 3000}]),
        ?assertMatch({error, {too_large, _}}, Result),
        ?assert(Us < 1000000),
        ?assertEqual(OsPid, kem_port:os_pid(Port)),
        BigParams = crypto:strong_rand_bytes(300000),
        ?assertMatch({error, {too_large, _}}, kem:execute(?DOUBLE, <<1, 2, 3, 4>>, #{params => BigParams})),
        ?assertMatch({error, {too_large, _}},
                     kem:call(execute_kernel_with_params, {<<"pixelize">>, <<1, 2, 3, 4>>, BigParams}, 3000)),
        ?assertMatch({error, {invalid_kernel_id, _}}, kem:execute(BigParams, <<1, 2, 3, 4>>, #{})),
        ?assertEqual(OsPid, kem_port:os_pid(Port)),
        Fits = crypto:strong_rand_bytes(8192),
        ?assertEqual({ok, kem_ref:double_ref(Fits, 8192)}, kem:execute(?DOUBLE, Fits, #{}))
    after
        application:set_env(kem, shm_threshold, Threshold)
    end.

%% Sessions and chains travel through the pipe only: bytes over the port's
%% frame limit would be a frame the port can answer to no caller (a
%% timeout, then a restart that loses every session of that port).
session_bytes_over_the_port_limit_are_refused_in_erlang() ->
    [Port] = kem_sup:port_names(),
    OsPid = kem_port:os_pid(Port),
    Big = crypto:strong_rand_bytes(300000),
    {ok, S} = kem:session_open(#{}),
    ok = kem:buffer_create(S, <<"acc">>, 64),
    Checks = [fun() -> kem:session_call(S, ?DOUBLE, Big, #{timeout => 3000}) end,
              fun() -> kem:buffer_create(S, <<"big">>, Big) end,
              fun() -> kem:buffer_write(S, <<"acc">>, 0, Big) end,
              fun() -> kem:chain([#{kernel => ?DOUBLE}], #{input => Big, timeout => 3000}) end,
              fun() -> kem:chain([#{kernel => ?DOUBLE}], #{session => S, input => Big, timeout => 3000}) end],
    [begin
         {Us, Result} = timer:tc(Check),
         ?assertMatch({error, {too_large, _}}, Result),
         ?assert(Us < 1000000)
     end || Check <- Checks],
    ?assertEqual(OsPid, kem_port:os_pid(Port)),
    %% The session is still there, and bytes that fit still go through.
    Fits = crypto:strong_rand_bytes(64),
    ?assertEqual(ok, kem:buffer_write(S, <<"acc">>, 0, Fits)),
    ?assertEqual({ok, Fits}, kem:buffer_read(S, <<"acc">>)),
    ?assertEqual({ok, kem_ref:double_ref(Fits, 64)}, kem:session_call(S, ?DOUBLE, Fits, #{})),
    ?assertMatch({error, {bad_args, _}}, kem:session_call(S, ?DOUBLE, Fits, #{timeout => -1})),
    ?assertMatch({error, {bad_args, _}}, kem:chain([#{kernel => ?DOUBLE}], #{input => Fits, timeout => foo})),
    ok = kem:session_close(S).

%% The quarantine holds on every road to a port: plain calls, session calls,
%% chains with or without a session, and dev_kem's execute_chain.
a_quarantined_kernel_is_refused_in_sessions_and_chains() ->
    Kernel = <<"quarantined_in_a_test">>,
    ok = kem_quarantine:add(Kernel),
    ?assertMatch({error, {quarantined, _}}, kem:execute(Kernel, <<1, 2, 3, 4>>, #{})),
    {ok, S} = kem:session_open(#{}),
    ?assertMatch({error, {quarantined, _}}, kem:session_call(S, Kernel, <<1, 2, 3, 4>>, #{})),
    Steps = [#{kernel => ?DOUBLE}, #{kernel => Kernel}],
    ?assertMatch({error, {quarantined, _}}, kem:chain(Steps, #{input => <<1, 2, 3, 4>>})),
    ?assertMatch({error, {quarantined, _}}, kem:chain(Steps, #{session => S, input => <<1, 2, 3, 4>>})),
    Body = kem_json:encode(#{<<"input-data">> => [1, 2, 3, 4],
                             <<"steps">> => [#{<<"kernel-id">> => ?DOUBLE}, #{<<"kernel-id">> => Kernel}]}),
    ?assertMatch({error, #{<<"status">> := 503, <<"reason">> := <<"quarantined">>}},
                 dev_kem:execute_chain(#{}, #{<<"body">> => Body}, #{})),
    ok = kem:session_close(S).

%% dev_kem's execute_chain is a request from outside the node too: no step
%% may ask for more output than request_max_output_bytes (1000 here).
a_chain_request_keeps_the_output_budget() ->
    Chain = fun(Input, Steps) ->
                dev_kem:execute_chain(#{}, #{<<"body">> => kem_json:encode(
                    #{<<"input-data">> => binary_to_list(Input), <<"steps">> => Steps})}, #{})
            end,
    Input = crypto:strong_rand_bytes(200),
    Double = #{<<"kernel-id">> => ?DOUBLE},
    ?assertMatch({error, #{<<"status">> := 413, <<"reason">> := <<"too_large">>}},
                 Chain(Input, [Double, Double#{<<"output-size">> => 1001}, Double#{<<"output-size">> => 4}])),
    ?assertMatch({error, #{<<"status">> := 413}}, Chain(crypto:strong_rand_bytes(1004), [Double])),
    %% The budget is the request's, not each step's (issue 24): two steps
    %% of 1000 bytes are 2000 bytes of buffers.
    ?assertMatch({error, #{<<"status">> := 413, <<"reason">> := <<"too_large">>}},
                 Chain(Input, [Double#{<<"output-size">> => 1000}, Double#{<<"output-size">> => 1000}])),
    %% At the budget it runs: double twice is times four, word by word.
    {ok, #{<<"status">> := 200, <<"body">> := Out}} =
        Chain(Input, [Double#{<<"output-size">> => 500}, Double#{<<"output-size">> => 500}]),
    ?assertEqual(kem_ref:double_ref(kem_ref:double_ref(Input, 500), 500), Out).

%% Session calls and chains run GPU work like any call: kem_metrics counts
%% them by method, and dev_kem's execute_chain reports its usage (headers,
%% and HyperBEAM's metering where present) as execute_kernel does.
session_calls_and_chains_are_counted_and_metered() ->
    Calls = fun(Method) -> maps:get({calls, Method}, maps:from_list(kem_metrics:snapshot()), 0) end,
    {SessionCalls, Chains} = {Calls(session_call), Calls(chain)},
    {ok, S} = kem:session_open(#{}),
    Input = crypto:strong_rand_bytes(400),
    ?assertEqual({ok, kem_ref:double_ref(Input, 400)}, kem:session_call(S, ?DOUBLE, Input, #{})),
    ?assertMatch({error, {kernel_not_found, _}}, kem:session_call(S, <<"nope">>, Input, #{})),
    ok = kem:session_close(S),
    ?assertEqual(SessionCalls + 2, Calls(session_call)),
    Body = kem_json:encode(#{<<"input-data">> => binary_to_list(Input),
                             <<"steps">> => [#{<<"kernel-id">> => ?DOUBLE, <<"output-size">> => 500},
                                             #{<<"kernel-id">> => ?DOUBLE}]}),
    {ok, Reply} = dev_kem:execute_chain(#{}, #{<<"body">> => Body}, #{}),
    ?assertEqual(kem_ref:double_ref(kem_ref:double_ref(Input, 500), 500), maps:get(<<"body">>, Reply)),
    ?assertMatch(#{<<"kem-usage-kernel-id">> := <<"double,double">>, <<"kem-usage-bytes-in">> := 400,
                   <<"kem-usage-bytes-out">> := 500, <<"kem-usage-clock">> := <<"wall">>}, Reply),
    ?assertEqual(Chains + 1, Calls(chain)).

%% As for a plain call: a session call that outlived the default timeout
%% on the GPU has its kernel quarantined (the port is replaced, so the
%% session is lost). The call is the runaway kernel's, which runs for
%% seconds, against a 1 s default: when the timer fires it is on the GPU,
%% whatever the machine's load. (With a 1 ms default and a merely slow
%% call, as before, a loaded machine's port had not yet read the call when
%% the timer fired: `unknown', rightly not quarantined; CI saw that once.)
a_session_call_that_times_out_quarantines_its_kernel() ->
    Default = application:get_env(kem, timeout, 30000),
    Runaway = #{workgroups => {16384, 64, 1}},
    %% Admitted and compiled first, at the default timeout and one
    %% workgroup: the call below must be on the GPU when its timer fires,
    %% not admitting or compiling (kem_timeout).
    {ok, Warm} = kem:session_open(#{}),
    {ok, _} = kem:session_call(Warm, <<"runaway">>, <<0:32>>, #{workgroups => {1, 1, 1}}),
    ok = kem:session_close(Warm),
    ok = application:set_env(kem, timeout, 1000),
    try
        {ok, S} = kem:session_open(#{timeout => 5000}),
        Reply = kem:session_call(S, <<"runaway">>, <<0:32>>, Runaway),
        ?assertMatch({error, {timeout, _}}, Reply),
        ?assert(kem_timeout:kernel_was_stuck(Reply)),
        ?assertMatch({error, {quarantined, _}}, kem:execute(<<"runaway">>, <<0:32>>, #{timeout => 5000})),
        %% Only that kernel.
        ?assertEqual(ok, kem_quarantine:check(?DOUBLE))
    after
        application:set_env(kem, timeout, Default)
    end,
    ?assertEqual(ok, kem_test_app:wait_for_service(10000)).

%%% the property: any terms in, a result or a structured error out

check_never_raises(Adjust) ->
    {Fun, Args} = Adjust(random_call()),
    Result = try apply(kem, Fun, Args)
             catch Class:Reason -> {raised, Class, Reason, Fun, Args}
             end,
    ?assert(well_formed(Result)),
    Result.

well_formed({{ok, _}, #{}}) -> true;  % request_chain_usage
well_formed({{error, {Reason, _}}, #{}}) when is_atom(Reason) -> true;
well_formed({ok, _}) -> true;
well_formed({error, {Reason, _}}) when is_atom(Reason) -> true;
well_formed(_) -> false.

random_call() ->
    case rand:uniform(5) of
        1 -> {execute, [kernel_id(), input(), opts()]};
        2 -> {call, [method(), call_args(), any_term(2)]};
        3 -> {request, [method(), call_args()]};
        4 -> {chain, [steps(), chain_opts()]};
        5 -> {request_chain_usage, [steps(), chain_opts()]}
    end.

steps() ->
    Step = fun() -> pick([#{kernel => kernel_id()}, #{kernel => kernel_id(), output_size => small_int()}, any_term(1)]) end,
    pick([[Step()], [Step(), Step()], [Step() | any_term(0)], [], any_term(2)]).

%% Timeouts long or invalid: a valid short one would only restart the port.
chain_opts() ->
    pick([#{}, #{input => input()}, #{input => input(), timeout => pick([5000, foo, -1, 1.5])},
          #{session => any_term(1)}, any_term(2)]).

kernel_id() -> pick([?DOUBLE, ?DOUBLE, ?DOUBLE, <<"nope">>, <<"../x">>, <<>>, any_term(2)]).
input() -> pick([crypto:strong_rand_bytes(rand:uniform(64)), crypto:strong_rand_bytes(rand:uniform(64)), <<>>, any_term(2)]).
method() -> pick([execute, execute, execute_kernel, execute_kernel_with_params, ping, stats, nonsense, any_term(1)]).

call_args() ->
    pick([{kernel_id(), input(), opts()}, {kernel_id(), input(), opts()}, {kernel_id(), input(), any_term(2)},
          {kernel_id(), input(), small_int()}, {}, any_term(3)]).

opts() ->
    Keys = [output_size_hint, output_size, params, workgroups, entry_point, timeout,
            max_output_bytes, output_shm, nonsense],
    Pairs = [option(pick(Keys)) || _ <- lists:seq(1, rand:uniform(3) - 1)],
    pick([maps:from_list(Pairs), maps:from_list(Pairs), maps:from_list(Pairs), any_term(2)]).

%% Half the time a value valid for that option, else any term or an edge.
option(Key) ->
    Key2 = pick([Key, Key, Key, any_term(1)]),
    {Key2, pick([valid_value(Key), option_value()])}.

valid_value(output_size_hint) -> rand:uniform(4);
valid_value(output_size) -> rand:uniform(256) - 1;
valid_value(params) -> <<1, 0, 0, 0, 2, 0, 0, 0>>;
valid_value(workgroups) -> {rand:uniform(4), 1, 1};
valid_value(entry_point) -> pick([<<"main">>, main, <<"nope">>]);
valid_value(timeout) -> pick([5000, infinity]);
valid_value(max_output_bytes) -> rand:uniform(512);
valid_value(_) -> any_term(1).

option_value() ->
    pick([small_int(), any_term(2), {small_int(), small_int(), small_int()},
          <<1, 0, 0, 0, 2, 0, 0, 0>>, <<"main">>, main, infinity]).

%% On the real port a valid timeout of a few ms only restarts the port
%% (kill_on_timeout): those become 5 s there.
no_short_timeouts({execute, [K, I, Opts = #{timeout := T}]}) -> {execute, [K, I, Opts#{timeout := long(T)}]};
no_short_timeouts({call, [M, A, T]}) -> {call, [M, A, long(T)]};
no_short_timeouts(Call) -> Call.

long(T) when is_integer(T), T >= 1, T < 1000 -> 5000;
long(T) -> T.

small_int() -> pick([-1, 0, 1, 2, 3, 4, 1 bsl 31, 1 bsl 64, -(1 bsl 70)]).

any_term(0) -> leaf();
any_term(Depth) ->
    case rand:uniform(6) of
        1 -> list_to_tuple([any_term(Depth - 1) || _ <- lists:seq(1, rand:uniform(4) - 1)]);
        2 -> [any_term(Depth - 1) || _ <- lists:seq(1, rand:uniform(4) - 1)];
        3 -> maps:from_list([{leaf(), any_term(Depth - 1)} || _ <- lists:seq(1, rand:uniform(3) - 1)]);
        _ -> leaf()
    end.

leaf() ->
    pick([rand:uniform(1 bsl 70) - (1 bsl 69), rand:uniform(10) - 5, rand:uniform() * 1.0e6 - 5.0e5,
          foo, undefined, infinity, true, <<>>, crypto:strong_rand_bytes(rand:uniform(9)),
          self(), make_ref(), "string", fun() -> ok end]).

pick(List) -> lists:nth(rand:uniform(length(List)), List).
